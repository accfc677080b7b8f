"""Readable loop nests of a State (also its canonical identity text).

In the readable form every variable a statement uses is bound where it is printed: a loop
binds its own, and the statement's axes, which a schedule splits and fuses into loops of other
names, are given as expressions of the printed loops on a line above it (`i = i.0 * 32 + i.1`),
or written into the indices where an axis has the name of another loop around it. The
canonical form (a program's identity) is the bare nest and does not change with this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ansor.schedule.relations import iterator_extents
from ansor.te import expr as E
from ansor.te.printer import expr_to_str

_KEYWORD = {"none": "for", "unroll": "unroll", "vectorize": "vectorize", "parallel": "parallel"}

#: Loops a shared buffer's region spans (every thread of the block fills it), so they are not
#: part of where its tile starts.
_RELAXED_BY_SCOPE = {"shared": frozenset({"threadIdx.x", "threadIdx.y", "threadIdx.z", "vthread"})}

#: A stage's loop variables (in iterator order) and the value of each of its op's axes, by name,
#: as expressions of those variables and of the loop variables of the stages around it.
AxisValues = dict[str, tuple[Sequence[E.Var], dict[str, E.Expr]]]

UNKNOWN = "?"  # a length a sketch has not decided yet


def state_to_str(state, canonical: bool = False, extents: dict[str, list[int]] | None = None,
                 axis_values: AxisValues | None = None) -> str:
    """The loop nest; `extents` (stage name -> loop extents from bound inference) replaces the
    declared extents, which for a stage computed inside another are larger than what runs, and
    `axis_values` (from lowering) gives each axis's exact value; without it the values are
    read off the schedule (a sketch's undecided lengths print as `?`)."""
    lines: list[str] = []
    placeholders = [s.name for s in state.stages if s.is_placeholder]
    if placeholders:
        lines.append("placeholder: " + ", ".join(placeholders))
    attached: dict[tuple[str, str], list[int]] = {}  # (stage, loop) -> stages computed there
    for sid, st in enumerate(state.stages):
        if isinstance(st.attach, tuple):
            attached.setdefault(st.attach, []).append(sid)
    bind = None if canonical else _Bindings(axis_values if axis_values is not None else _scheduled_values(state))
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.attach != "root":
            continue
        _print_stage(state, sid, 0, lines, canonical, frozenset(), extents or {}, attached, bind, frozenset())
    return "\n".join(lines)


class _Bindings:
    """The printed name of every loop variable seen so far (0 for a loop not printed, whose one
    iteration is 0), and the axis values that statements are bound with."""

    def __init__(self, values: AxisValues):
        self.values = values
        self.names: dict[int, E.Expr] = {}
        self.depth: dict[str, int] = {}  # printed loop name -> its place in the printed order

    def loop(self, stage: str, pos: int, printed: str | None) -> None:
        if printed:
            self.depth.setdefault(printed, len(self.depth))
        entry = self.values.get(stage)
        if entry is not None and pos < len(entry[0]):
            self.names[id(entry[0][pos])] = E.Var(printed) if printed else E.Const(0, "int32")

    def value(self, stage: str, axis: str) -> E.Expr | None:
        """An axis's value in printed loop names, its terms outer loops first (None where it is
        not known)."""
        entry = self.values.get(stage)
        if entry is None or axis not in entry[1]:
            return None
        renamed = _fold_zeros(E.transform(entry[1][axis],
                                          lambda n: self.names.get(id(n)) if isinstance(n, E.Var) else None))
        terms = _terms(renamed)
        if len(terms) < 2:
            return renamed
        terms.sort(key=lambda t: min((self.depth.get(v.name, len(self.depth)) for v in E.free_vars(t)),
                                     default=len(self.depth) + 1))
        return sum(terms[1:], terms[0])


def _terms(expr: E.Expr) -> list[E.Expr]:
    """The terms of a sum (a single term for anything else)."""
    if isinstance(expr, E.BinOp) and expr.op == "+":
        return _terms(expr.a) + _terms(expr.b)
    return [expr]


def _print_stage(state, sid: int, indent: int, lines: list[str], canonical: bool, outer: frozenset,
                 extents: dict, attached: dict, bind: _Bindings | None, printed: frozenset) -> None:
    """Loops of one stage; a loop whose name an enclosing loop already uses gets the stage name
    as a prefix, so nested stages read unambiguously."""
    st = state.stages[sid]
    pad = "  " * indent
    if st.auto_unroll_max_step:
        lines.append(f"{pad}# {st.name}: auto_unroll_max_step = {st.auto_unroll_max_step}")
    inferred = extents.get(st.name)
    fused_parts = _fused_parts(st) if canonical else {}
    for pos, it in enumerate(st.iters):
        ext = "?" if it.extent is None else (inferred[pos] if inferred else it.extent)
        if it.name in fused_parts:  # equal fused extents can hide different loop orders
            ext = f"{ext} = {fused_parts[it.name]}"
        kw = _KEYWORD.get(it.annotation, f"bind({it.annotation})")
        name = None
        if canonical or ext != 1 or it.annotation != "none":
            name = f"{st.name}.{it.name}" if it.name in outer else it.name
            lines.append(f"{pad}{kw} {name} in range({ext}):")
            indent += 1
            pad = "  " * indent
            printed = printed | {name}
        if bind is not None:
            bind.loop(st.name, pos, name)
        outer = outer | {it.name}
        for child in attached.get((st.name, it.name), ()):
            _print_stage(state, child, indent, lines, canonical, outer, extents, attached, bind, printed)
    if bind is None:
        lines.append(pad + _body_str(st))
        return
    bindings, inline = _axis_bindings(st, bind, printed)
    if bindings:
        lines.append(pad + "; ".join(f"{axis} = {value}" for axis, value in bindings))
    lines.append(pad + _body_str(st, inline))


def _axis_bindings(st, bind: _Bindings, printed: frozenset) -> tuple[list[tuple[str, str]], dict[int, E.Expr]]:
    """(axis name, value text) for each axis the loops do not bind under its own name, and the
    axes written into the statement instead (an axis named like another loop around it, whose
    binding would read as a definition in terms of itself)."""
    bindings: list[tuple[str, str]] = []
    inline: dict[int, E.Expr] = {}
    for axis in [*st.op.axes, *st.op.reduce_axes]:
        value = bind.value(st.name, axis.name)
        if value is None:
            continue
        text = expr_to_str(value)
        if text == axis.name:
            continue
        if axis.name in printed:
            inline[id(axis)] = value
        else:
            bindings.append((axis.name, text))
    return bindings, inline


def _fused_parts(st) -> dict[str, str]:
    """Fused iterator name -> the extents of the loops it fuses, e.g. "1*4*7"."""
    fuses = [rel for rel in st.relations if not hasattr(rel, "parent")]
    if not fuses or st.op is None:
        return {}
    root = {a.name: a.extent for a in list(st.op.axes) + list(st.op.reduce_axes)}
    try:
        ext = iterator_extents(st, root)
    except (KeyError, TypeError):  # undecided split lengths (a sketch)
        return {}
    return {rel.fused: "*".join(str(ext[c]) for c in rel.children) for rel in fuses}


def _body_str(st, inline: dict[int, E.Expr] | None = None) -> str:
    op = st.op
    scope = f" ({st.scope})" if st.scope != "global" else ""
    if st.layout is not None:
        factor = "?" if st.layout[1] is None else st.layout[1]
        scope += f" (stored with {op.axes[st.layout[0]].name} tiled by {factor})"
    if st.interleave is not None:
        scope += f" (and {op.axes[st.interleave[0]].name} interleaved by {st.interleave[1]})"

    def shown(expr: E.Expr) -> str:
        if inline:
            expr = E.transform(expr, lambda n: inline.get(id(n)) if isinstance(n, E.Var) else None)
        return expr_to_str(expr)

    axes = ", ".join(shown(a) if inline else a.name for a in op.axes)  # (the canonical key is hot)
    body = op.body
    if isinstance(body, E.Reduce):
        where = "" if body.where is None else f" if {shown(body.where)}"
        sym = {"sum": "+=", "max": "max=", "min": "min="}[body.combiner]
        text = f"{st.name}[{axes}]{scope} {sym} {shown(body.source)}{where}"
    else:
        text = f"{st.name}[{axes}]{scope} = {shown(body)}"
    return text


# --- axis values read off the schedule (no bound inference) ----------------------------------

def _scheduled_values(state) -> AxisValues:
    """Each stage's axis values from its splits and fuses; a stage computed inside another loop
    starts where its first consumer's read starts at that loop (the loops inside it at 0)."""
    loop_vars: dict[int, list[E.Var]] = {}
    annotation: dict[int, str] = {}
    for sid, st in enumerate(state.stages):
        if not st.is_placeholder and st.attach != "inline":
            loop_vars[sid] = [E.Var(it.name) for it in st.iters]
            annotation.update((id(v), it.annotation) for v, it in zip(loop_vars[sid], st.iters))
    values: dict[int, dict[str, E.Expr]] = {}
    busy: set[int] = set()

    def path(sid: int) -> list[E.Var]:
        st = state.stages[sid]
        if not isinstance(st.attach, tuple):
            return []
        tid = state.stage_id(st.attach[0])
        pos = state.stages[tid].iter_index(st.attach[1])
        return path(tid) + loop_vars[tid][:pos + 1]

    def values_of(sid: int) -> dict[str, E.Expr]:
        if sid in values or sid in busy:
            return values.get(sid, {})
        busy.add(sid)
        st = state.stages[sid]
        try:
            own = _split_values(st, {it.name: v for it, v in zip(st.iters, loop_vars[sid])})
            out = {a.name: own[a.name] + a.lo if a.lo else own[a.name] for a in st.op.reduce_axes if a.name in own}
            origin = _tile_origin(state, sid, path(sid), annotation, values_of) if isinstance(st.attach, tuple) else None
            for d, a in enumerate(st.op.axes):
                if a.name in own:
                    out[a.name] = own[a.name] if origin is None else _fold_zeros(_plus(origin[d], own[a.name]))
        except Exception:  # noqa: BLE001 - a state error messages print: the bare statement, never a crash
            out = {}
        values[sid] = out
        busy.discard(sid)
        return out

    return {state.stages[sid].name: (loop_vars[sid], values_of(sid)) for sid in loop_vars}


def _split_values(st, leaf: dict[str, E.Expr]) -> dict[str, E.Expr]:
    """Every iterator's value (root axes included) from the leaf loops', through the stage's
    splits and fuses; a stride or extent not decided yet is `?`."""
    ext: dict[str, int | None] = {a.name: a.extent for a in [*st.op.axes, *st.op.reduce_axes]}
    for rel in st.relations:
        if hasattr(rel, "parent"):
            ext.update(zip(rel.children, rel.child_extents(ext.get(rel.parent))))
        else:
            parts = [ext.get(c) for c in rel.children]
            ext[rel.fused] = None if None in parts else math.prod(parts)
    values = dict(leaf)
    for rel in reversed(st.relations):
        if hasattr(rel, "parent"):
            if rel.inner_to_outer and None not in rel.factors:
                strides: list[int | None] = rel.strides()
            else:
                strides = _strides([ext.get(c) for c in rel.children])
            terms = [_times(values[c], s) for c, s in zip(rel.children, strides) if c in values]
            values[rel.parent] = _fold_zeros(sum(terms[1:], terms[0])) if terms else E.Const(0, "int32")
        elif rel.fused in values:
            fused = values[rel.fused]
            strides = _strides([ext.get(c) for c in rel.children])
            for k, (child, stride) in enumerate(zip(rel.children, strides)):
                v = fused if stride == 1 else fused // (E.Var(UNKNOWN) if stride is None else stride)
                if k:
                    extent = ext.get(child)
                    v = v % (E.Var(UNKNOWN) if extent is None else extent)
                values[child] = v
    return values


def _plus(a: E.Expr, b: E.Expr) -> E.Expr:
    """a + b with b's terms added one by one (`t + x + y`, not `t + (x + y)`)."""
    if isinstance(b, E.BinOp) and b.op == "+":
        return _plus(_plus(a, b.a), b.b)
    return a + b


def _strides(extents: list[int | None]) -> list[int | None]:
    """Mixed-radix strides of pieces with these extents (outer first); None once one is unknown."""
    out: list[int | None] = []
    acc: int | None = 1
    for e in reversed(extents):
        out.append(acc)
        acc = None if acc is None or e is None else acc * e
    return list(reversed(out))


def _times(value: E.Expr, stride: int | None) -> E.Expr:
    """value * stride, the stride `?` where it is not decided yet."""
    return value if stride == 1 else value * (E.Var(UNKNOWN) if stride is None else stride)


def _tile_origin(state, sid: int, path: list[E.Var], annotation: dict[int, str], values_of) -> list[E.Expr] | None:
    """Where the tile of an attached stage starts, per axis: its first consumer's read of it
    with the consumer's axes as their values and every loop inside the attach point at 0 (the
    first iteration reads the tile's start when indices grow with the loops, as they do)."""
    st = state.stages[sid]
    relaxed = _RELAXED_BY_SCOPE.get(st.scope, frozenset())
    kept = {id(v) for v in path if annotation.get(id(v)) not in relaxed}
    for cid in state.consumers(sid):
        reads = [r for r in E.walk(state.effective_body(cid)) if isinstance(r, E.TensorRead) and r.tensor is st.tensor]
        if not reads:
            continue
        consumer = state.stages[cid].op
        cvalues = values_of(cid)
        by_axis = {id(a): cvalues[a.name] for a in [*consumer.axes, *consumer.reduce_axes] if a.name in cvalues}

        def start(index: E.Expr) -> E.Expr:
            at_axes = E.transform(index, lambda n: by_axis.get(id(n)) if isinstance(n, E.Var) else None)
            return _fold_zeros(E.transform(at_axes, lambda n: E.Const(0, "int32") if isinstance(n, E.Var)
                                           and n.name != UNKNOWN and id(n) not in kept else None))

        return [start(i) for i in reads[0].indices]
    return None


def _fold_zeros(expr: E.Expr) -> E.Expr:
    """`x * 0`, `x + 0`, `0 // x`, `0 % x` and the like folded away, nothing else changed (the
    loops stay in the order the schedule gives them)."""

    def zero(e: E.Expr) -> bool:
        return isinstance(e, E.Const) and e.value == 0

    def fold(node: E.Expr) -> E.Expr | None:  # children come folded already (bottom-up)
        if not isinstance(node, E.BinOp):
            return None
        a, b = node.a, node.b
        if node.op == "*" and (zero(a) or zero(b)) or node.op in ("//", "%") and zero(a):
            return E.Const(0, node.dtype)
        if node.op == "+" and zero(a):
            return b
        if node.op in ("+", "-") and zero(b):
            return a
        if node.op in ("*", "//") and isinstance(b, E.Const) and b.value == 1:
            return a
        return None

    return E.transform(expr, fold)
