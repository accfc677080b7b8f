"""Key/value caches written in place: the one operator of a model graph that writes memory it reads.

A decode step of a language model appends one key row and one value row per layer to caches
of a declared maximum length and attends over the valid prefix. As values, `cache_write(cache,
rows, position)` is a new cache (the numpy executor copies); run that way, every token would
copy every cache. A compiled model instead runs it in place: the cache is a *state* input (the
model owns its buffer, filled once, never copied in at a call), the write's output shares that
buffer, and the step copies only the new rows, from C, inside the model's one foreign call.

This is the one exception to "kernels do not write their inputs", so it is allowed only where
it cannot be observed: the cache must be a graph input written by exactly one `cache_write`,
read by nothing else (every later reader reads the write's output), and never a graph output.
`state_inputs` checks that, and `memory_plan` refuses any step that would read the old value
after the write.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Callable

import numpy as np

from ansor.graph.ir import Graph, GraphError, Node
from ansor.graph.partition import Subgraph

OP = "cache_write"
ENTRY = "ansor_cache_write"

#: The descriptor the C row writer reads: outer count, bytes of the written rows per outer
#: index, the cache's and the rows' strides per outer index (bytes), bytes per position,
#: positions in the cache less the rows written (the largest valid start), position is int64.
_DESCRIPTOR_FIELDS = 7

_SOURCE = f"""/* ansor: rows written into a key/value cache at a position, in place */
#include <stdint.h>
#include <string.h>
void {ENTRY}(void* cache, const void* rows, const void* position, const int64_t* d) {{
  int64_t start = d[6] ? ((const int64_t*)position)[0] : (int64_t)((const int32_t*)position)[0];
  if (start < 0 || start > d[5]) return;  /* scanned before the call; never write outside */
  char* dst = (char*)cache + start * d[4];
  const char* src = (const char*)rows;
  for (int64_t o = 0; o < d[0]; ++o)
    memcpy(dst + o * d[2], src + o * d[3], (size_t)d[1]);
}}
"""


class KVCacheError(GraphError):
    """A `cache_write` used where running it in place could be observed."""


def state_inputs(graph: Graph) -> dict[str, str]:
    """{cache input: the value written into it} for every `cache_write` of `graph`: the inputs
    a compiled model owns as state. Raises KVCacheError, naming the node, where the write could
    not run in place (its cache is not a graph input, is written twice, read by another node,
    or returned)."""
    written: dict[str, str] = {}
    consumers = graph.consumers()
    for node in graph.nodes:
        if node.op != OP:
            continue
        cache = node.inputs[0]
        where = f"%{node.output} = {OP}" + (f" ({node.source})" if node.source else "")
        if cache not in graph.inputs:
            raise KVCacheError(f"{where}: the cache must be a graph input (a buffer the model owns), "
                               f"got the computed value %{cache}")
        if cache in written:
            raise KVCacheError(f"{where}: cache %{cache} is written twice in one step")
        others = [n for n in consumers.get(cache, []) if n is not node]
        if others or cache in graph.outputs or cache in node.inputs[1:]:
            raise KVCacheError(f"{where}: cache %{cache} is read elsewhere than by its write "
                               f"(read the write's output instead), so it cannot be written in place")
        written[cache] = node.output
    return written


def written_cache(sub: Subgraph) -> str | None:
    """The cache a subgraph writes in place (its one node is a `cache_write`), else None."""
    nodes = sub.nodes
    if len(nodes) == 1 and nodes[0].op == OP:
        return nodes[0].inputs[0]
    return None


def cache_write_call(node: Node, cache: np.ndarray, rows: np.ndarray, position: np.ndarray) -> Callable[[], None]:
    """A zero-argument call that copies `rows` into `cache` at `position[0]` along the node's
    axis, in place; like a compiled kernel's fixed call, it carries `address` and `pointers`
    so a model's steps still run as one foreign call (`measure.sequence`)."""
    axis = node.attrs["axis"] % cache.ndim
    for name, array in (("cache", cache), ("rows", rows)):
        if not array.flags.c_contiguous:
            raise ValueError(f"{OP}: the {name} buffer must be C-contiguous")
    if position.dtype not in (np.int64, np.int32) or position.shape != (1,):
        raise ValueError(f"{OP}: position must be one int64 or int32, got {position.dtype} {position.shape}")
    item = cache.dtype.itemsize
    inner = int(np.prod(cache.shape[axis + 1:], dtype=np.int64)) * item  # bytes per position
    outer = int(np.prod(cache.shape[:axis], dtype=np.int64))
    n = rows.shape[axis]
    descriptor = np.array([outer, n * inner, cache.shape[axis] * inner, n * inner, inner,
                           cache.shape[axis] - n, position.dtype == np.int64], dtype=np.int64)
    func = _row_writer()
    kept = [cache, rows, position, descriptor]
    pointers = tuple(a.ctypes.data for a in kept)

    def call() -> None:
        func(*pointers)

    call.buffers = kept
    call.address = ctypes.cast(func, ctypes.c_void_p).value
    call.pointers = pointers
    return call


@lru_cache(maxsize=1)
def _row_writer() -> Callable:
    """The compiled row writer (built once per process, cached on disk by the Builder)."""
    from ansor.measure.build import Builder
    from ansor.measure.errors import MeasureErrorNo

    built = Builder().compile_one(_SOURCE)
    if built.error_no != MeasureErrorNo.NO_ERROR or built.lib_path is None:
        raise RuntimeError(f"compiling the cache row writer failed: {built.error_msg}")
    lib = ctypes.CDLL(built.lib_path)
    fn = getattr(lib, ENTRY)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 4
    fn.library = lib
    return fn
