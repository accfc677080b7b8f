"""Bounds checks hoisted out of loop nests: a guarded copy runs unguarded where it can.

A convolution's padded input is computed as `select(0 <= y + dy < H and 0 <= x + dx < W,
X[y + dy, x + dx], 0)`. Inside a loop nest the check costs a few integer operations per
element and, worse, stops vectorization (gcc cannot load a vector of X where some lanes may
lie outside it). Yet almost every tile of the image lies wholly inside it. This pass finds
nests of loops around one store whose value holds such selects, works out (by interval
arithmetic over the nest's loops, the variables outside held fixed) a condition under which
every check of the nest passes (the `if`s of a partial tile count as checks too), and emits `ir.Unswitched(cond, fast, slow)`: the nest without
the checks where `cond` holds at run time, the nest as scheduled otherwise, itself unswitched
one loop further in (so a tile on the image's border still copies its interior rows
unguarded). A depthwise convolution, which reads each padded element only nine times, spent
most of its time in the guarded copy.
"""

from __future__ import annotations

from ansor.lower import ir
from ansor.lower.rewrite import StmtRewriter
from ansor.te import expr as E
from ansor.te.arith import simplify, symbolic_bounds, to_linear
from ansor.te.printer import expr_to_str

#: How a comparison `a op b` holds for all values of `d = a - b` in [lo, hi].
_HOLDS = {">=": ("lo", ">="), ">": ("lo", ">"), "<=": ("hi", "<="), "<": ("hi", "<")}
_SERIAL_KINDS = ("serial", "unrolled", "vectorized")


def _comparisons(cond: E.Expr) -> list[E.Compare] | None:
    """The integer comparisons whose conjunction `cond` is, or None if it is anything else."""
    if type(cond) is E.Compare:
        return [cond] if cond.op in _HOLDS and E.is_int(cond.a.dtype) else None
    if type(cond) is E.Logical and cond.op == "and":
        out: list[E.Compare] = []
        for arg in cond.args:
            part = _comparisons(arg)
            if part is None:
                return None
            out += part
        return out
    return None


def _guards(value: E.Expr) -> list[E.Select]:
    """The selects of a stored value that are bounds checks (conditions on integers only)."""
    return [n for n in E.walk(value) if type(n) is E.Select and _comparisons(n.cond) is not None]


def _holds_throughout(cmp: E.Compare, inner: dict) -> E.Expr | None:
    """A condition on the variables outside `inner` under which `cmp` holds for every value of
    the `inner` loop variables; None where interval arithmetic cannot bound it."""
    bounds = symbolic_bounds(E.BinOp("-", cmp.a, cmp.b, cmp.a.dtype), inner)
    if bounds is None:
        return None
    side, op = _HOLDS[cmp.op]
    return E.Compare(op, bounds[0] if side == "lo" else bounds[1], E.Const(0, cmp.a.dtype))


def _perfect_nest(loop: ir.For) -> tuple[list[ir.For], list[E.Expr], ir.Store] | None:
    """The loops from `loop` inwards, the conditions of the `if`s between them (the guards of
    a partial tile) and the one store they surround, if that is all they hold."""
    loops, conds, node = [], [], loop
    while True:
        if type(node) is ir.For and node.kind in _SERIAL_KINDS:
            loops.append(node)
            node = node.body
        elif type(node) is ir.IfThenElse and node.orelse is None and _comparisons(node.cond) is not None:
            conds.append(node.cond)
            node = node.then
        else:
            break
    return (loops, conds, node) if type(node) is ir.Store else None


def _rebuild(loops: list[ir.For], body: ir.Stmt) -> ir.Stmt:
    for f in reversed(loops):
        body = ir.For(f.var, f.extent, f.kind, body, f.unroll_hint)
    return body


def _unguarded(node: E.Expr) -> E.Expr | None:
    """A bounds check's value when in bounds (for `E.transform`: every check passes)."""
    return node.a if type(node) is E.Select and _comparisons(node.cond) is not None else None


def _fails_somewhere(cmp: E.Compare, inner: dict, outer: dict) -> bool:
    """True when `cmp` is false at some point of the box its variables range over (`inner`,
    then `outer`): then no interval argument proves it throughout, so the nest it guards is
    never unguarded. Decided exactly where the difference of its sides is linear in atoms that
    each take every value of their range and move independently (distinct variables, alone or
    divided by or taken modulo a constant: a fused loop's coordinates); its extremes are then
    reached. False (undecided) for anything else."""
    lin = to_linear(E.BinOp("-", cmp.a, cmp.b, cmp.a.dtype))
    lo = hi = lin.const
    used: set[int] = set()
    for atom, coef in lin.terms.values():
        r = _atom_range(atom, inner, outer, used)
        if r is None:
            return False
        a, b = coef * r[0], coef * r[1]
        lo, hi = (lo + a, hi + b) if a <= b else (lo + b, hi + a)
    op = cmp.op
    return lo < 0 if op == ">=" else lo <= 0 if op == ">" else hi > 0 if op == "<=" else hi >= 0


def _atom_range(atom: E.Expr, inner: dict, outer: dict, used: set[int]) -> tuple[int, int] | None:
    """The least and greatest value (both reached) over a variable's range of the variable,
    floor-divided by constants any number of times, then maybe taken modulo a constant; its
    variable recorded in `used`. None for another expression or a variable already used."""
    modulus = None
    if _by_const(atom, "%"):
        modulus, atom = atom.b.value, atom.a
    divisors = []
    while _by_const(atom, "//"):
        divisors.append(atom.b.value)
        atom = atom.a
    if type(atom) is not E.Var or id(atom) in used:
        return None
    r = inner.get(id(atom)) or outer.get(id(atom))
    if r is None:
        return None
    used.add(id(atom))
    lo, hi = r  # every integer between is taken, and still is after each division
    for c in reversed(divisors):
        lo, hi = lo // c, hi // c
    if modulus is not None:
        c = modulus
        return (lo % c, hi % c) if lo // c == hi // c else (0, c - 1)
    return lo, hi


def _by_const(e: E.Expr, op: str) -> bool:
    return type(e) is E.BinOp and e.op == op and type(e.b) is E.Const and e.b.value > 0


class _Unswitcher(StmtRewriter):
    def __init__(self, as_scheduled: bool = False) -> None:
        super().__init__()
        self.failed: list[str] = []  # the checks that failed on the way in (their text)
        self.as_scheduled = as_scheduled  # each `Unswitched` as its `slow` nest (see scheduled_view)

    def loop(self, s: ir.For) -> ir.Stmt:
        nest = _perfect_nest(s)
        if nest is None:
            return super().loop(s)
        loops, conds, store = nest
        guards = _guards(store.value)
        if not guards:
            return s
        inner = {id(f.var): (0, f.extent - 1) for f in loops}
        if self.as_scheduled:
            # a check that fails somewhere keeps this nest (and every nest inside it, which
            # holds the same selects) as scheduled; an `if` that does, this nest alone
            if any(_fails_somewhere(cmp, inner, self.ranges) for g in guards for cmp in _comparisons(g.cond)):
                return s
            if any(_fails_somewhere(cmp, inner, self.ranges) for c in conds for cmp in _comparisons(c)):
                return super().loop(s)
        checks = []
        for cond in [g.cond for g in guards] + conds:
            for cmp in _comparisons(cond):
                check = _holds_throughout(cmp, inner)
                if check is None:
                    return super().loop(s)
                checks.append(check)
        cond = simplify(E.all_of(checks), self.ranges)
        if type(cond) is E.Const and not cond.value:
            return super().loop(s)  # never in bounds throughout here: try the loops inside
        fast = _rebuild(loops, ir.Store(store.buffer, store.indices, E.transform(store.value, _unguarded)))
        if type(cond) is E.Const:
            return fast
        if self.as_scheduled:
            return super().loop(s)
        text = expr_to_str(cond)
        if text in self.failed:  # the loop's variable is in no check: decided further out
            return super().loop(s)
        self.failed.append(text)
        slow = super().loop(s)
        self.failed.pop()
        return ir.Unswitched(cond, fast, slow)


def unswitch_bounds_checks(func: ir.PrimFunc) -> ir.PrimFunc:
    """`func` (and its prepack function) with the guarded store nests unswitched."""
    return _Unswitcher().apply(func)


def unswitched_as_scheduled(func: ir.PrimFunc) -> ir.PrimFunc:
    """What analyses read of `unswitch_bounds_checks(func)`, which see each `Unswitched` as its
    `slow` nest: `func` with only the nests whose checks always pass made unguarded. Cheaper:
    a check that visibly fails somewhere (a padded border) needs no bounds worked out, and
    no unguarded copy is built. The cost model's features lower programs with it."""
    return _Unswitcher(as_scheduled=True).apply(func)
