"""The isolated side of `Runner`: receives run requests over a pipe and answers with RunResults.

Started by `Runner` with the child end of a pipe as a file descriptor; kernels run in this
process so that their crashes and hangs cannot reach the tuner. Only small results go back.
"""

from __future__ import annotations

import sys
import time
import traceback
from multiprocessing.connection import Connection

import numpy as np

from ansor.process_lifetime import bind_to_parent

from .errors import MeasureErrorNo
from .input_copies import InputCopies
from .library import KernelLibrary
from .run import RunRequest, RunResult, evaluate_kernel, load_array


#: A worker that waits this long for its next run frees its task's input copies: the programs
#: of a batch follow each other at once, while a model's other tasks (each with its worker)
#: take their turns meanwhile, and their workers would otherwise all hold their copies.
IDLE_RELEASE_SECONDS = 1.0


class TaskArrays:
    """The current task's inputs and references, loaded once and reused for every run, and
    the copies of its inputs that its programs are timed on (`InputCopies`, made when a
    program first needs them; freed when the task changes)."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.inputs: list[np.ndarray] = []
        self.expected: list[np.ndarray] = []
        self.copies: InputCopies | None = None

    def load(self, request: RunRequest) -> None:
        if request.task_key == self.key:
            return
        self.key = None
        self.release_copies()
        self.inputs = [load_array(path) for path in request.input_paths]
        self.expected = [load_array(path) for path in request.expected_paths]
        self.copies = InputCopies(self.inputs)
        self.key = request.task_key

    def holds_copies(self) -> bool:
        return self.copies is not None and self.copies.nbytes > 0

    def release_copies(self) -> None:
        """Free the input copies (they are made again when a program needs them)."""
        if self.copies is not None:
            self.copies.clear()


def serve(conn: Connection, task: TaskArrays | None = None,
          idle_release: float = IDLE_RELEASE_SECONDS) -> None:
    """Answer run requests until the parent sends None (its request to stop) or closes the
    pipe. A closed pipe alone reaches the worker only once every copy of the parent's end is
    closed, and processes forked by the parent meanwhile (the search's workers) hold copies.
    The task's input copies are freed after `idle_release` seconds without a request."""
    task = task if task is not None else TaskArrays()
    try:
        conn.send("ready")
    except OSError:  # the parent stopped waiting (interrupted while the worker started)
        return
    while True:
        try:
            if task.holds_copies() and not conn.poll(idle_release):
                task.release_copies()
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        start = time.perf_counter()
        try:
            task.load(request)
            result = evaluate_kernel(
                request.lib_path, request.func_name, task.inputs, task.expected,
                request.timing, request.rtol, request.atol, request.loader or KernelLibrary,
                task.copies,
            )
        except Exception:  # noqa: BLE001 - report, and stay alive for the next run
            message = traceback.format_exc(limit=3)
            result = RunResult((), int(MeasureErrorNo.UNKNOWN_ERROR), message,
                               time.perf_counter() - start)
        try:
            conn.send(result)
        except OSError:
            return


def main(fd: int, parent_pid: int, creator_is_main_thread: bool) -> None:
    """Entry point of the worker process. A closed pipe ends it between runs; a kernel stuck in
    a loop never reads the pipe, so the worker is also bound to the parent's life."""
    bind_to_parent(parent_pid, creator_is_main_thread)
    serve(Connection(fd))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
