"""The untuned program of a matrix-vector product: rows of a matrix against one vector.

A linear layer called on one row (a decoding step's projections and LM head) is a reduction
whose matrix is read once per call and never reused: its time is the time to stream the
matrix, so the program that matters reads each matrix row contiguously, as vectors, with
enough independent accumulators to keep the loads in flight. The plain default program
(one scalar multiply-add chain per output) runs an order of magnitude below that, and the
tiled sketches of the search vectorize the output axis, which reads the matrix across its rows.

Here the reduction is factored (`rfactor`) on an inner piece of `lanes` reduction steps, so
each output row is accumulated as a vector of partial sums along the reduction: for a block
of ROWS rows, every step loads one vector of the input and one of each row, and the block's
accumulators stay in registers (`lower.register_tile`); each row's partial sums are then
added up. The row blocks run on one thread unless the matrix is large (`MIN_PARALLEL_BYTES`):
waking a second thread costs microseconds on an idle machine and a scheduler slice on a busy
one, far more than such a product takes on one core.
"""

from __future__ import annotations

from ansor.schedule.state import ScheduleError, State
from ansor.te import expr as E
from ansor.te.attention import is_template

#: Rows of the matrix per register block, the largest that divides the rows: each holds one
#: accumulator vector, and with one operand vector per row and the input's they fit 32 (or 16)
#: vector registers.
ROW_BLOCKS = (8, 4, 2)
#: Bytes of the matrix from which the row blocks run in parallel: past the last-level cache of
#: common server CPUs the matrix streams from memory, where two cores' loads outrun one, and
#: one core's pass over it takes milliseconds.
MIN_PARALLEL_BYTES = 64 * 2**20
#: Element types whose accumulators the register-tile pass keeps in vector registers.
DTYPES = ("float32",)


def matvec_axes(state: State, sid: int, lanes: int) -> tuple[int, E.IterVar] | None:
    """(the position of the output axis, the reduce axis) when stage `sid` is a matrix-vector
    product this program serves: a sum over one reduce axis whose extent is a multiple of
    `lanes`, one output axis longer than one (the others of extent one), and every operand
    that the reduction walks indexed by the reduce axis alone in its last dimension (rows read
    contiguously); at least one operand is a matrix (indexed by the output axis too)."""
    st = state.stages[sid]
    op = st.op
    body = getattr(op, "body", None)
    if st.is_placeholder or not isinstance(body, E.Reduce) or body.combiner != "sum" or body.where is not None:
        return None
    if len(body.axes) != 1 or body.dtype not in DTYPES:
        return None
    k = body.axes[0]
    if k.lo != 0 or k.extent % lanes or k.extent < lanes:
        return None
    long_axes = [i for i, a in enumerate(op.axes) if a.extent > 1]
    if len(long_axes) != 1:
        return None
    out_axis = op.axes[long_axes[0]]
    reads = [n for n in E.walk(body.source) if type(n) is E.TensorRead]
    matrix = False
    for read in reads:
        if read.dtype not in DTYPES:
            return None
        uses_k = [j for j, index in enumerate(read.indices) if mentions(index, k)]
        if not uses_k:
            continue
        if uses_k != [len(read.indices) - 1] or read.indices[-1] is not k:
            return None
        matrix = matrix or any(mentions(index, out_axis) for index in read.indices)
    return (long_axes[0], k) if matrix else None


def matvec_program(state: State, sid: int, vector_unit_bytes: int, num_cores: int) -> State | None:
    """A copy of `state` with root stage `sid` scheduled as the matrix-vector program, when it
    is one (`matvec_axes`, with the vector lanes of float32); else None. The program adds a
    stage before `sid` (the partial sums), so later stages' indices grow by one."""
    if any(is_template(st.op) for st in state.stages):  # a template's lowering writes its whole program
        return None
    lanes = max(1, vector_unit_bytes // 4)
    found = matvec_axes(state, sid, lanes)
    if found is None:
        return None
    out_pos, k = found
    rows = state.stages[sid].op.axes[out_pos].extent
    block = next((r for r in ROW_BLOCKS if rows % r == 0), 1)
    matrix_bytes = rows * k.extent * 4
    s = state.copy()
    try:
        _schedule(s, sid, out_pos, k, lanes, block, parallel=num_cores > 1 and matrix_bytes >= MIN_PARALLEL_BYTES)
    except ScheduleError:
        return None
    return s


def _schedule(s: State, sid: int, out_pos: int, k: E.IterVar, lanes: int, block: int, parallel: bool) -> None:
    n_axes = len(s.stages[sid].op.axes)
    _, inner = s.split(sid, k.name, [lanes])
    partial = s.rfactor(sid, inner.name, n_axes)  # partial[..., lane] = sum over the outer steps
    final = partial + 1
    out_name = s.stages[final].iters[out_pos].name
    row_blocks, _ = s.split(final, out_name, [block])
    s.compute_at(partial, final, row_blocks.name)
    names = [it.name for it in s.stages[partial].iters]
    # partial's loops: the output axes, the lane, the outer reduction -> the reduction outside
    # the rows of the block, the lane innermost
    spatial, lane, steps = names[:n_axes], names[n_axes], names[n_axes + 1]
    s.reorder(partial, [n for j, n in enumerate(spatial) if j != out_pos] + [steps, spatial[out_pos], lane])
    s.vectorize(partial, lane)
    s.unroll(partial, spatial[out_pos])
    if parallel:
        s.parallel(final, row_blocks.name)


def mentions(index: E.Expr, var: E.IterVar) -> bool:
    """Whether the iteration variable `var` occurs in `index`."""
    return any(n is var for n in E.walk(index))

