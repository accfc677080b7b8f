"""Integer arithmetic on expressions: constant bounds, symbolic bounds and simplification.

Index expressions after tiling are sums of loop variables times constants, plus floor
divisions and remainders from fused loops. Keeping them in a canonical linear form lets
`(i0*32 + i1) - i0*32` become `i1`, which is what makes local buffers index with constants.
"""

from __future__ import annotations

import math
from typing import Optional

from ansor.te import expr as E
from ansor.te.dtypes import convert_scalar

Ranges = dict  # id(Var) -> (lo, hi) inclusive integer bounds

INF = math.inf


# ---------------------------------------------------------------------------------------------
# numeric bounds

def const_bounds(expr: E.Expr, ranges: Ranges) -> tuple[float, float]:
    """Inclusive numeric bounds of an integer expression; (-inf, inf) where unknown."""
    t = type(expr)
    if t is E.Var or t is E.IterVar:
        return ranges.get(id(expr), _UNBOUNDED)
    if t is E.Const:
        v = expr.value
        return (v, v) if not isinstance(v, bool) else (int(v), int(v))
    if t is E.BinOp and expr.dtype in _INT:
        alo, ahi = const_bounds(expr.a, ranges)
        blo, bhi = const_bounds(expr.b, ranges)
        op = expr.op
        if op == "+":
            return alo + blo, ahi + bhi
        if op == "-":
            return alo - bhi, ahi - blo
        if op == "*":
            prods = [_mul(x, y) for x in (alo, ahi) for y in (blo, bhi)]
            return min(prods), max(prods)
        if op in ("//", "%") and blo == bhi and isinstance(blo, int) and blo > 0:
            c = blo
            if op == "//":
                return _fdiv(alo, c), _fdiv(ahi, c)
            if alo != -INF and ahi != INF and _fdiv(alo, c) == _fdiv(ahi, c):
                return alo % c, ahi % c
            return 0, c - 1
        if op == "min":
            return min(alo, blo), min(ahi, bhi)
        if op == "max":
            return max(alo, blo), max(ahi, bhi)
    if t is E.Cast and expr.dtype in _INT and expr.value.dtype in _INT:
        return const_bounds(expr.value, ranges)
    if t is E.Select and expr.dtype in _INT:
        alo, ahi = const_bounds(expr.a, ranges)
        blo, bhi = const_bounds(expr.b, ranges)
        return min(alo, blo), max(ahi, bhi)
    return -INF, INF


_UNBOUNDED = (-INF, INF)
_INT = frozenset(E.INDEX_DTYPES)  # narrow and unsigned integers wrap: opaque here


def _mul(x: float, y: float) -> float:
    if x == 0 or y == 0:
        return 0
    return x * y


def _fdiv(x: float, c: int) -> float:
    return x if x in (INF, -INF) else x // c


# ---------------------------------------------------------------------------------------------
# linear forms

class Linear:
    """sum(coef * atom) + const over integer atoms (variables or non-linear subterms)."""

    __slots__ = ("terms", "const")

    def __init__(self, terms: dict | None = None, const: int = 0):
        self.terms: dict[str, tuple[E.Expr, int]] = terms or {}
        self.const = const

    def add(self, other: "Linear", sign: int = 1) -> "Linear":
        terms = dict(self.terms)
        for key, (atom, coef) in other.terms.items():
            _accumulate(terms, key, atom, sign * coef)
        return Linear(terms, self.const + sign * other.const)

    def scale(self, c: int) -> "Linear":
        if c == 0:
            return Linear()
        return Linear({k: (a, coef * c) for k, (a, coef) in self.terms.items()}, self.const * c)


def atom_key(expr: E.Expr) -> int | str:
    """A structural key for an atom: equal keys mean equal expressions (a variable's key is
    its identity)."""
    t = type(expr)
    if t is E.Var or t is E.IterVar:
        return id(expr)
    if t is E.Const:
        return f"c{expr.value}"
    if t is E.TensorRead:
        return f"T{id(expr.tensor)}[" + ",".join(_key_text(i) for i in expr.indices) + "]"
    inner = ",".join(_key_text(c) for c in expr.children())
    tag = getattr(expr, "op", getattr(expr, "func", getattr(expr, "combiner", t.__name__)))
    # what a node holds besides its children is part of its identity: the buffer a load reads
    # (two loads at the same index of different buffers are different values), its dtype (a
    # cast to int32 is not a cast to int64), a reduction's axes
    owner = getattr(expr, "buffer", None)
    if owner is not None:
        tag = f"{tag}@{id(owner)}"
    axes = getattr(expr, "axes", None)
    if axes:
        tag = f"{tag}/" + ",".join(str(id(a)) for a in axes)
    return f"{t.__name__}:{tag}:{expr.dtype}({inner})"


def _key_text(expr: E.Expr) -> str:
    key = atom_key(expr)
    return f"v{key}" if type(key) is int else key


def to_linear(expr: E.Expr) -> Linear:
    if isinstance(expr, E.Const) and E.is_index(expr.dtype):
        return Linear({}, expr.value)
    if isinstance(expr, E.BinOp) and E.is_index(expr.dtype):
        if expr.op == "+":
            return to_linear(expr.a).add(to_linear(expr.b))
        if expr.op == "-":
            return to_linear(expr.a).add(to_linear(expr.b), -1)
        if expr.op == "*":
            la, lb = to_linear(expr.a), to_linear(expr.b)
            if not la.terms:
                return lb.scale(la.const)
            if not lb.terms:
                return la.scale(lb.const)
    return Linear({atom_key(expr): (expr, 1)}, 0)


def from_linear(lin: Linear, dtype: str = "int32", order_keys: dict | None = None) -> E.Expr:
    """Rebuild an expression: positive terms first, in a stable order, then the constant.
    `order_keys` keeps the sort keys of non-variable terms (by id) for the next call."""
    items = lin.terms.values()
    if len(items) > 1:
        if order_keys is None:
            items = sorted(items, key=lambda t: (t[1] < 0, _order_key(t[0])))
        else:
            items = sorted(items, key=lambda t: (t[1] < 0, _kept_order_key(t[0], order_keys)))
    out: Optional[E.Expr] = None
    for atom, coef in items:
        mag = abs(coef)
        term = atom if mag == 1 else E.BinOp("*", atom, E.Const(mag, dtype), dtype)
        if out is None:
            out = term if coef > 0 else E.BinOp("-", E.Const(0, dtype), term, dtype)
        else:
            out = E.BinOp("+" if coef > 0 else "-", out, term, dtype)
    if out is None:
        return E.Const(lin.const, dtype)
    if lin.const > 0:
        out = E.BinOp("+", out, E.Const(lin.const, dtype), dtype)
    elif lin.const < 0:
        out = E.BinOp("-", out, E.Const(-lin.const, dtype), dtype)
    return out


def _kept_order_key(atom: E.Expr, kept: dict) -> str:
    if isinstance(atom, E.Var):
        return atom.name
    known = kept.get(id(atom))
    if known is None:
        known = kept[id(atom)] = (atom, _order_key(atom))  # the atom is kept so that its id stays unique
    return known[1]


def _order_key(atom: E.Expr) -> str:
    """Terms sort by their printed text, so the same program always prints the same way
    (never by object identity)."""
    if isinstance(atom, E.Var):
        return atom.name
    return "~" + E.expr_to_str(atom)


# ---------------------------------------------------------------------------------------------
# simplification

def simplify(expr: E.Expr, ranges: Ranges | None = None) -> E.Expr:
    """Fold constants, normalize integer sums, and drop div/mod/min/max/conditions that the
    variable ranges decide.

    An integer sum-of-products subtree is normalized once as a whole (its atoms simplified
    first), not at every level, which keeps simplification linear in the expression size.
    """
    return Simplifier(ranges or {}).simplify(expr)


class Simplifier:
    """`simplify` with memory: results and linear forms are kept (by node identity) across
    calls, so an expression built from already simplified parts (a loop's index substituted
    into a body) costs only its new nodes. Valid while no variable's range changes: the
    lowering gives each loop variable its range when it creates it."""

    def __init__(self, ranges: Ranges):
        self.ranges = ranges
        self._memo: dict[int, tuple[E.Expr, E.Expr]] = {}  # id(node) -> (node, simplified)
        self._linear: dict[int, tuple[E.Expr, Linear]] = {}  # id(simplified node) -> (node, form)
        self._built: dict[tuple, E.Expr] = {}  # a form's terms (in order) and constant -> its node
        self._order_keys: dict[int, tuple[E.Expr, str]] = {}  # for from_linear

    def simplify(self, expr: E.Expr) -> E.Expr:
        return self._go(expr)

    def bounds_over(self, expr: E.Expr, inner: Ranges) -> tuple[E.Expr, E.Expr] | None:
        """`symbolic_bounds` of an expression this simplifier produced; linear ones (every
        atom a variable, or free of the swept variables) are bounded straight from their form."""
        known = self._linear.get(id(expr))
        if known is None:
            return symbolic_bounds(expr, inner)
        lin = known[1]
        swept, fixed_terms = {}, {}
        for k, t in lin.terms.items():
            atom = t[0]
            if type(atom) is E.Var:
                (swept if id(atom) in inner else fixed_terms)[k] = t
            elif _has_inner(atom, inner):  # e.g. (i + k) // 4 with k swept: interval arithmetic
                return symbolic_bounds(expr, inner)
            else:  # an atom of outer variables only (a fused loop's // and %) is held fixed
                fixed_terms[k] = t
        fixed = Linear(fixed_terms, lin.const)
        lo, hi = _linear_bounds(Linear(swept), inner)
        dtype = expr.dtype
        return (self._rebuilt(fixed.add(Linear({}, lo)), dtype), self._rebuilt(fixed.add(Linear({}, hi)), dtype))

    def _rebuilt(self, lin: Linear, dtype: str) -> E.Expr:
        """The canonical node of a form; a form met again (the same terms in the same order,
        so `from_linear` would build the same tree) gives the node built the first time."""
        key = (dtype, lin.const, *[(k, t[1]) for k, t in lin.terms.items()])
        out = self._built.get(key)
        if out is None:
            out = self._built[key] = from_linear(lin, dtype, self._order_keys)
            self._linear[id(out)] = (out, lin)
            self._memo[id(out)] = (out, out)  # canonical forms simplify to themselves
        return out

    def _linear_of(self, node: E.Expr) -> Linear:
        known = self._linear.get(id(node))
        if known is not None:
            return known[1]
        if type(node) is E.BinOp and node.op in _LINEAR_OPS and node.dtype in _INT:
            a, b = self._linear_of(node.a), self._linear_of(node.b)
            op = node.op
            if op == "+":
                return a.add(b)
            if op == "-":
                return a.add(b, -1)
            if not a.terms:
                return b.scale(a.const)
            if not b.terms:
                return a.scale(b.const)
            prod = E.BinOp("*", self._rebuilt(a, node.dtype), self._rebuilt(b, node.dtype), node.dtype)
            return Linear({atom_key(prod): (prod, 1)}, 0)
        atom = self._go(node)
        known = self._linear.get(id(atom))
        if known is not None:
            return known[1]
        t = type(atom)
        if t is E.Const and atom.dtype in _INT:
            return Linear({}, atom.value)
        if t is E.BinOp and atom.op in _LINEAR_OPS and atom.dtype in _INT:
            return to_linear(atom)
        return Linear({atom_key(atom): (atom, 1)}, 0)

    def _plus_zero(self, node: E.BinOp) -> E.Expr | None:
        """`a + 0` or `a - 0` of a canonical `a` (a tile's index less a region that starts at 0)
        is `a` itself, which the general path would rebuild: its form unchanged, no `%` term to
        merge, the same node from `_rebuilt`. None for anything else."""
        b = node.b
        if node.op == "*" or type(b) is not E.Const or b.value != 0 or b.dtype not in _INT:
            return None
        a = node.a
        known = self._linear.get(id(a))
        if known is None or a.dtype != node.dtype:
            return None
        for atom, _ in known[1].terms.values():
            if type(atom) is E.BinOp and atom.op == "%":
                return None
        return a

    def _merged_div_mod(self, lin: Linear) -> Linear:
        """k*(x % m) + k*m*(x // m) -> k*x. Splitting a division at a divisor of its divisor
        (`_split_at_divisor`) turns ((32*i + k) % 1024) + ((32*i + k) // 1024)*1024, which gcc
        folds to 32*i + k itself, into k + 32*(i % 32) + 1024*(i // 32), which it does not (a
        2-norm's reduction then stops vectorizing); this puts it back."""
        mods = [(key, atom, coef) for key, (atom, coef) in lin.terms.items()
                if type(atom) is E.BinOp and atom.op == "%" and type(atom.b) is E.Const]
        if not mods:
            return lin
        terms, const = dict(lin.terms), lin.const
        for key, atom, coef in mods:
            div_key = atom_key(E.BinOp("//", atom.a, atom.b, atom.dtype))
            div = terms.get(div_key)
            if key not in terms or div is None or div[1] != coef * atom.b.value:
                continue
            del terms[key], terms[div_key]
            whole = self._linear_of(atom.a)
            for k, (a, c) in whole.terms.items():
                _accumulate(terms, k, a, coef * c)
            const += coef * whole.const
        return Linear(terms, const)

    def _flat_linear(self, node: E.Expr) -> Linear:
        """`_linear_of` of a sum-of-products tree in one left-to-right pass, with no
        intermediate forms: scales are pushed down to the leaves, and only leaves that are
        neither variables, constants nor known forms go through `_linear_of`. The terms come
        out in the same order as `_linear_of`'s (first appearance, a cancelled term forgotten)."""
        terms: dict = {}
        const = 0
        linear, ranges = self._linear, self.ranges
        stack = [(node, 1)]
        pop, push = stack.pop, stack.append
        while stack:
            n, scale = pop()
            known = linear.get(id(n))
            if known is not None:
                lin = known[1]
                const += scale * lin.const
                items = lin.terms.items()
            else:
                t = type(n)
                if t is E.BinOp and n.op in _LINEAR_OPS and n.dtype in _INT:
                    op = n.op
                    if op == "+":
                        push((n.b, scale))
                        push((n.a, scale))
                        continue
                    if op == "-":
                        push((n.b, -scale))
                        push((n.a, scale))
                        continue
                    if type(n.b) is E.Const:
                        push((n.a, scale * n.b.value))
                        continue
                    if type(n.a) is E.Const:
                        push((n.b, scale * n.a.value))
                        continue
                elif t is E.Var or t is E.IterVar:
                    r = ranges.get(id(n))
                    if r is not None and r[0] == r[1]:
                        const += scale * r[0]
                    elif scale:
                        _accumulate(terms, id(n), n, scale)
                    continue
                elif t is E.Const and n.dtype in _INT:
                    const += scale * n.value
                    continue
                lin = self._linear_of(n)
                const += scale * lin.const
                items = lin.terms.items()
            if scale:
                for key, (atom, coef) in items:
                    _accumulate(terms, key, atom, scale * coef)
        return Linear(terms, const)

    def _go(self, node: E.Expr) -> E.Expr:
        key = id(node)
        hit = self._memo.get(key)
        if hit is not None:
            return hit[1]
        if type(node) is E.BinOp and node.op in _LINEAR_OPS and node.dtype in _INT:
            result = self._plus_zero(node)
            if result is None:
                result = self._rebuilt(self._merged_div_mod(self._flat_linear(node)), node.dtype)
        else:
            kids = node.children()
            rebuilt = node
            if kids:
                new_kids = [self._go(c) for c in kids]
                for n, o in zip(new_kids, kids):
                    if n is not o:
                        rebuilt = E.rebuild(node, new_kids)
                        break
            out = _simplify_node(rebuilt, self.ranges, self._go)
            result = rebuilt if out is None else out
        self._memo[key] = (node, result)  # the node is kept so that its id stays unique
        return result


def _accumulate(terms: dict, key, atom: E.Expr, coef: int) -> None:
    """Add coef * atom to a linear form's terms; a term that cancels is removed (so it
    comes back last if it appears again)."""
    old = terms.get(key)
    if old is None:
        terms[key] = (atom, coef)
        return
    total = old[1] + coef
    if total:
        terms[key] = (atom, total)
    else:
        del terms[key]


_LINEAR_OPS = frozenset(("+", "-", "*"))


def _simplify_node(node: E.Expr, ranges: Ranges, simp) -> E.Expr | None:
    """One node whose children are simplified; `simp` simplifies the helper expressions it
    builds. None: no change."""
    if isinstance(node, E.Var):
        r = ranges.get(id(node))
        return E.Const(r[0], node.dtype) if r is not None and r[0] == r[1] else None
    if isinstance(node, E.BinOp):
        a, b = node.a, node.b
        if isinstance(a, E.Const) and isinstance(b, E.Const):
            return _fold_binop(node.op, a, b, node.dtype)
        if E.is_index(node.dtype):
            return _simplify_int_binop(node, ranges, simp)
        if node.op == "*" and _is_const(b, 1):
            return a
        if node.op == "*" and _is_const(a, 1):
            return b
        if node.op in ("+", "-") and _is_const(b, 0):
            return a
        if node.op == "+" and _is_const(a, 0):
            return b
        return None
    if isinstance(node, E.Compare):
        if E.is_index(node.a.dtype):
            diff = simp(E.BinOp("-", node.a, node.b, node.a.dtype))
            lo, hi = const_bounds(diff, ranges)
            decided = _decide(node.op, lo, hi)
            if decided is not None:
                return E.Const(decided, "bool")
        if isinstance(node.a, E.Const) and isinstance(node.b, E.Const):
            return E.Const(_compare(node.op, node.a.value, node.b.value), "bool")
        return None
    if isinstance(node, E.Logical):
        args = node.args
        if node.op == "not":
            if isinstance(args[0], E.Const):
                return E.Const(not args[0].value, "bool")
            return None
        absorbing = node.op == "or"
        kept = []
        for arg in args:
            if isinstance(arg, E.Const):
                if arg.value == absorbing:
                    return E.Const(absorbing, "bool")
                continue
            kept.append(arg)
        if not kept:
            return E.Const(not absorbing, "bool")
        return kept[0] if len(kept) == 1 else (None if len(kept) == len(args) else E.Logical(node.op, tuple(kept)))
    if isinstance(node, E.Select) and isinstance(node.cond, E.Const):
        return node.a if node.cond.value else node.b
    if isinstance(node, E.Cast) and isinstance(node.value, E.Const):
        return E.Const(convert_scalar(node.value.value, node.dtype), node.dtype)
    return None


def _linear_bounds(lin: Linear, ranges: Ranges) -> tuple[float, float]:
    """`const_bounds` of a linear form, term by term."""
    lo = hi = lin.const
    for atom, coef in lin.terms.values():
        alo, ahi = ranges.get(id(atom), (-INF, INF)) if isinstance(atom, E.Var) else const_bounds(atom, ranges)
        a, b = _mul(alo, coef), _mul(ahi, coef)
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


def _is_const(e: E.Expr, v) -> bool:
    return isinstance(e, E.Const) and e.value == v


def _decide(op: str, lo: float, hi: float) -> bool | None:
    """Decide `diff op 0` from the bounds of diff, or None if the bounds do not decide."""
    if op == "<":
        return True if hi < 0 else (False if lo >= 0 else None)
    if op == "<=":
        return True if hi <= 0 else (False if lo > 0 else None)
    if op == ">":
        return True if lo > 0 else (False if hi <= 0 else None)
    if op == ">=":
        return True if lo >= 0 else (False if hi < 0 else None)
    if op == "==":
        return True if lo == hi == 0 else (False if lo > 0 or hi < 0 else None)
    if op == "!=":
        return False if lo == hi == 0 else (True if lo > 0 or hi < 0 else None)
    return None


def _compare(op: str, a, b) -> bool:
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op]


def _fold_binop(op: str, a: E.Const, b: E.Const, dtype: str) -> E.Expr:
    x, y = a.value, b.value
    if op in ("//", "%", "/") and y == 0:
        return E.BinOp(op, a, b, dtype)
    value = {
        "+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "/": lambda: x / y,
        "//": lambda: x // y, "%": lambda: x % y, "min": lambda: min(x, y), "max": lambda: max(x, y),
    }[op]()
    return E.Const(value, dtype)  # a narrow integer wraps, a float16 rounds, as the kernel computes


def _simplify_int_binop(node: E.BinOp, ranges: Ranges, simp) -> E.Expr | None:
    op, dtype = node.op, node.dtype  # + - * never get here: simplify() normalizes them whole
    if op in ("//", "%") and isinstance(node.b, E.Const) and node.b.value > 0:
        c = node.b.value
        lin = to_linear(node.a)
        quotient = Linear({k: (a, coef // c) for k, (a, coef) in lin.terms.items() if coef % c == 0},
                          lin.const // c)
        rest = Linear({k: (a, coef) for k, (a, coef) in lin.terms.items() if coef % c != 0},
                      lin.const % c)
        rest_expr = from_linear(rest, dtype)
        lo, hi = _linear_bounds(rest, ranges)
        if 0 <= lo and hi < c:  # the remainder part never crosses a multiple of c
            return from_linear(quotient, dtype) if op == "//" else rest_expr
        split = _split_at_divisor(rest, c, op, dtype, ranges, simp)
        if split is not None:
            if op == "%" or not (quotient.terms or quotient.const):
                return split
            return simp(E.BinOp("+", from_linear(quotient, dtype), split, dtype))
        if op == "%":
            if not rest.terms:
                return E.Const(rest.const, dtype)
            return E.BinOp("%", rest_expr, node.b, dtype) if quotient.terms or lin.const != rest.const else None
        if quotient.terms or quotient.const:
            return from_linear(quotient, dtype) + E.BinOp("//", rest_expr, node.b, dtype)
        return None
    if op in ("min", "max"):
        diff = simp(E.BinOp("-", node.a, node.b, dtype))
        lo, hi = const_bounds(diff, ranges)
        if hi <= 0:
            return node.a if op == "min" else node.b
        if lo >= 0:
            return node.b if op == "min" else node.a
    return None


def _split_at_divisor(rest: Linear, c: int, op: str, dtype: str, ranges: Ranges, simp) -> E.Expr | None:
    """`rest // c` or `rest % c` where rest = c1*a + b, c1 divides c and b stays in [0, c1):
    a // (c/c1), and (a % (c/c1))*c1 + b. A split loop packed into tiles of 64 gives
    ((16*i0 + i1) % 64) with i1 < 16; rewritten, the index is contiguous in i1 and gcc stores
    whole vectors instead of one element at a time (batch matmul's packing, for one)."""
    for c1 in sorted({math.gcd(coef, c) for _, coef in rest.terms.values()} - {1}, reverse=True):
        big = Linear({k: (a, coef // c1) for k, (a, coef) in rest.terms.items() if coef % c1 == 0},
                     rest.const // c1)
        small = Linear({k: (a, coef) for k, (a, coef) in rest.terms.items() if coef % c1 != 0},
                       rest.const % c1)
        lo, hi = _linear_bounds(small, ranges)
        if not big.terms or lo < 0 or hi >= c1:
            continue
        a, m = from_linear(big, dtype), E.Const(c // c1, dtype)
        if op == "//":
            return simp(E.BinOp("//", a, m, dtype))
        scaled = E.BinOp("*", E.BinOp("%", a, m, dtype), E.Const(c1, dtype), dtype)
        return simp(E.BinOp("+", scaled, from_linear(small, dtype), dtype))
    return None


# ---------------------------------------------------------------------------------------------
# symbolic bounds (for bound inference)

def symbolic_bounds(expr: E.Expr, inner: Ranges) -> tuple[E.Expr, E.Expr] | None:
    """Bounds of an integer expression when the variables in `inner` sweep their ranges and
    every other variable is held fixed; None where interval arithmetic cannot say."""
    result = _sym(expr, inner)
    if result is None:
        return None
    lo, hi = result
    return simplify(lo), simplify(hi)


def _has_inner(expr: E.Expr, inner: Ranges) -> bool:
    return any(isinstance(n, E.Var) and id(n) in inner for n in E.walk(expr))


def _sym(expr: E.Expr, inner: Ranges):
    if not _has_inner(expr, inner):
        return expr, expr
    if isinstance(expr, E.Var):
        lo, hi = inner[id(expr)]
        return E.Const(lo, expr.dtype), E.Const(hi, expr.dtype)
    if isinstance(expr, E.BinOp) and E.is_index(expr.dtype):
        a, b = _sym(expr.a, inner), _sym(expr.b, inner)
        if a is None or b is None:
            return None
        dt = expr.dtype
        if expr.op == "+":
            return E.BinOp("+", a[0], b[0], dt), E.BinOp("+", a[1], b[1], dt)
        if expr.op == "-":
            return E.BinOp("-", a[0], b[1], dt), E.BinOp("-", a[1], b[0], dt)
        if expr.op == "*":
            for (x, y) in ((a, b), (b, a)):
                c = simplify(y[0])
                if y[0] is y[1] and isinstance(c, E.Const):
                    lo, hi = (x[0], x[1]) if c.value >= 0 else (x[1], x[0])
                    return E.BinOp("*", lo, c, dt), E.BinOp("*", hi, c, dt)
            return None
        if expr.op in ("//", "%") and b[0] is b[1]:
            c = simplify(b[0])
            if isinstance(c, E.Const) and c.value > 0:
                if expr.op == "//":
                    return E.BinOp("//", a[0], c, dt), E.BinOp("//", a[1], c, dt)
                return E.Const(0, dt), E.Const(c.value - 1, dt)
            return None
        if expr.op in ("min", "max"):
            return E.BinOp(expr.op, a[0], b[0], dt), E.BinOp(expr.op, a[1], b[1], dt)
    return None
