"""The copies of a task's inputs that its programs are timed on, kept from one program to the next.

A kernel timed "as in a model" (`TimingPolicy.cold_bytes`) cycles through copies of its inputs
and packed buffers spanning up to twice the last-level cache (`timing.RotatedCalls`). Every
program of a task reads the same inputs; only its packed buffers (its own weight layout) are
its own. Making all the copies anew for each program cost the copying and the page faults of
whatever memory the allocator did not reuse (about 5 ms a program of ResNet-18's tasks;
BENCHMARKS.md). `InputCopies` keeps the input copies of one task alive between its programs,
and the memory of the packed copies too: a new program only copies its packed buffers into
memory that is already mapped.

What is timed does not change: the same calls on the same number of distinct copies, each
holding the task's inputs as they were given (a program that writes into its inputs drops the
copies, so the next program gets fresh ones: `keep_if_unchanged`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ansor.memory import ALIGNMENT, aligned_copy, aligned_empty


def _padded(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two C-contiguous arrays hold the same bytes (NaNs included)."""
    if a.nbytes != b.nbytes:
        return False
    word = np.uint64 if a.nbytes % 8 == 0 else np.uint8
    return bool(np.array_equal(a.reshape(-1).view(np.uint8).view(word), b.reshape(-1).view(np.uint8).view(word)))


class InputCopies:
    """Copies of one task's inputs (`originals`) for successive programs of the task.

    `rotated_sets` hands a program its sets of buffers: the cached input copies (made when
    first needed), the program's outputs shared, and its packed buffers copied into memory kept
    from the previous program (one arena per set, grown when too small). At most as many sets
    are kept as the largest program asked for, so the memory held is what one program's
    rotation spans. `clear` frees everything (a new task, an idle worker).
    """

    def __init__(self, originals: Sequence[np.ndarray]) -> None:
        self.originals = [np.ascontiguousarray(array) for array in originals]
        self._inputs: list[list[np.ndarray]] = []  # one list of input copies per set
        self._arenas: list[np.ndarray] = []        # one packed-buffer arena per set
        self.made = 0      # input sets copied (each a set of fresh memory)
        self.reused = 0    # input sets handed out again without copying
        self.arenas_made = 0  # packed-buffer arenas allocated (the others were reused)

    @property
    def nbytes(self) -> int:
        """Bytes held by the copies and arenas."""
        return (sum(a.nbytes for inputs in self._inputs for a in inputs)
                + sum(arena.nbytes for arena in self._arenas))

    def fits(self, inputs: Sequence[np.ndarray]) -> bool:
        """Whether `inputs` have the shapes and dtypes of the originals (the same task)."""
        return len(inputs) == len(self.originals) and all(
            a.shape == o.shape and a.dtype == o.dtype for a, o in zip(inputs, self.originals))

    def holds(self, inputs: Sequence[np.ndarray]) -> bool:
        """Whether these copies were made from `inputs` (the same arrays, or equal bytes)."""
        return self.fits(inputs) and all(a is o or same_bytes(np.ascontiguousarray(a), o)
                                         for a, o in zip(inputs, self.originals))

    def rotated_sets(self, buffers: Sequence[np.ndarray], n_inputs: int, packed_from: int,
                     count: int) -> list[list[np.ndarray]]:
        """`count` copies of `buffers` (inputs, outputs, packed buffers): the inputs from the
        cache, the outputs (`buffers[n_inputs:packed_from]`) shared, the packed buffers copied."""
        if not self.fits(buffers[:n_inputs]):
            raise ValueError("the inputs are not those of the task the copies were made for")
        self.reused += min(count, len(self._inputs))
        while len(self._inputs) < count:
            self._inputs.append([aligned_copy(array) for array in self.originals])
            self.made += 1
        packed = list(buffers[packed_from:])
        sizes = [_padded(array.nbytes) for array in packed]
        del self._arenas[count:]  # sets this program does not use: freed
        sets = []
        for index in range(count):
            copy = list(buffers)
            copy[:n_inputs] = self._inputs[index]
            if packed:
                copy[packed_from:] = self._packed_copies(index, packed, sizes)
            sets.append(copy)
        return sets

    def _packed_copies(self, index: int, packed: list[np.ndarray], sizes: list[int]) -> list[np.ndarray]:
        need = sum(sizes)
        if index < len(self._arenas) and self._arenas[index].nbytes >= need:
            arena = self._arenas[index]
        else:
            arena = aligned_empty((need,), np.uint8)
            self.arenas_made += 1
            if index < len(self._arenas):
                self._arenas[index] = arena
            else:
                self._arenas.append(arena)
        copies, offset = [], 0
        for array, size in zip(packed, sizes):
            view = arena[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
            np.copyto(view, array)
            copies.append(view)
            offset += size
        return copies

    def keep_if_unchanged(self, used_inputs: Sequence[np.ndarray]) -> bool:
        """Keep the copies only if `used_inputs`, the program's own copy of the inputs (called
        at least as often as any cached one), still holds the originals: a program that writes
        into its inputs must not hand changed data to the next. Returns whether they were kept."""
        if len(used_inputs) == len(self.originals) and all(
                same_bytes(np.ascontiguousarray(a), o) for a, o in zip(used_inputs, self.originals)):
            return True
        self.clear()
        return False

    def clear(self) -> None:
        """Free every copy (the counters stay)."""
        self._inputs.clear()
        self._arenas.clear()
