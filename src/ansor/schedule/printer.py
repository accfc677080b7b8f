"""Readable loop nests of a State (also its canonical identity text)."""

from __future__ import annotations

from ansor.schedule.relations import iterator_extents
from ansor.te import expr as E
from ansor.te.printer import expr_to_str

_KEYWORD = {"none": "for", "unroll": "unroll", "vectorize": "vectorize", "parallel": "parallel"}


def state_to_str(state, canonical: bool = False, extents: dict[str, list[int]] | None = None) -> str:
    """The loop nest; `extents` (stage name -> loop extents from bound inference) replaces the
    declared extents, which for a stage computed inside another are larger than what runs."""
    lines: list[str] = []
    placeholders = [s.name for s in state.stages if s.is_placeholder]
    if placeholders:
        lines.append("placeholder: " + ", ".join(placeholders))
    attached: dict[tuple[str, str], list[int]] = {}  # (stage, loop) -> stages computed there
    for sid, st in enumerate(state.stages):
        if isinstance(st.attach, tuple):
            attached.setdefault(st.attach, []).append(sid)
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.attach != "root":
            continue
        _print_stage(state, sid, 0, lines, canonical, frozenset(), extents or {}, attached)
    return "\n".join(lines)


def _print_stage(state, sid: int, indent: int, lines: list[str], canonical: bool, outer: frozenset,
                 extents: dict, attached: dict) -> None:
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
        if canonical or ext != 1 or it.annotation != "none":
            name = f"{st.name}.{it.name}" if it.name in outer else it.name
            lines.append(f"{pad}{kw} {name} in range({ext}):")
            indent += 1
            pad = "  " * indent
        outer = outer | {it.name}
        for child in attached.get((st.name, it.name), ()):
            _print_stage(state, child, indent, lines, canonical, outer, extents, attached)
    lines.append(pad + _body_str(st))


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


def _body_str(st) -> str:
    op = st.op
    scope = f" ({st.scope})" if st.scope != "global" else ""
    if st.layout is not None:
        factor = "?" if st.layout[1] is None else st.layout[1]
        scope += f" (stored with {op.axes[st.layout[0]].name} tiled by {factor})"
    axes = ", ".join(a.name for a in op.axes)
    body = op.body
    if isinstance(body, E.Reduce):
        where = "" if body.where is None else f" if {expr_to_str(body.where)}"
        sym = {"sum": "+=", "max": "max=", "min": "min="}[body.combiner]
        text = f"{st.name}[{axes}]{scope} {sym} {expr_to_str(body.source)}{where}"
    else:
        text = f"{st.name}[{axes}]{scope} = {expr_to_str(body)}"
    return text
