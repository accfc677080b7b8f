"""Readable loop nests of a State (also its canonical identity text)."""

from __future__ import annotations

from ansor.te import expr as E
from ansor.te.printer import expr_to_str

_KEYWORD = {"none": "for", "unroll": "unroll", "vectorize": "vectorize", "parallel": "parallel"}


def state_to_str(state, canonical: bool = False) -> str:
    lines: list[str] = []
    placeholders = [s.name for s in state.stages if s.is_placeholder]
    if placeholders:
        lines.append("placeholder: " + ", ".join(placeholders))
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.attach != "root":
            continue
        _print_stage(state, sid, 0, lines, canonical)
    return "\n".join(lines)


def _print_stage(state, sid: int, indent: int, lines: list[str], canonical: bool) -> None:
    st = state.stages[sid]
    pad = "  " * indent
    if st.auto_unroll_max_step:
        lines.append(f"{pad}# {st.name}: auto_unroll_max_step = {st.auto_unroll_max_step}")
    for it in st.iters:
        ext = "?" if it.extent is None else it.extent
        kw = _KEYWORD.get(it.annotation, f"bind({it.annotation})")
        if canonical or it.extent != 1 or it.annotation != "none":
            lines.append(f"{pad}{kw} {it.name} in range({ext}):")
            indent += 1
            pad = "  " * indent
        for child in state.attached_to(st.name, it.name):
            _print_stage(state, child, indent, lines, canonical)
    lines.append(pad + _body_str(st, canonical))


def _body_str(st, canonical: bool) -> str:
    op = st.op
    scope = f" ({st.scope})" if st.scope != "global" else ""
    axes = ", ".join(a.name for a in op.axes)
    body = op.body
    if isinstance(body, E.Reduce):
        where = "" if body.where is None else f" if {expr_to_str(body.where)}"
        sym = {"sum": "+=", "max": "max=", "min": "min="}[body.combiner]
        text = f"{st.name}[{axes}]{scope} {sym} {expr_to_str(body.source)}{where}"
    else:
        text = f"{st.name}[{axes}]{scope} = {expr_to_str(body)}"
    if canonical:
        # the inlined producers change what is computed, so the key lists them
        return text
    return text
