"""How a stage's original axes are computed from its loop iterators (through splits and fuses)."""

from __future__ import annotations

import math

from ansor.te import expr as E


def iterator_extents(stage, root_extents: dict[str, int]) -> dict[str, int]:
    """Extent of every iterator name (root, intermediate and leaf) given the root extents."""
    ext = dict(root_extents)
    for rel in stage.relations:
        if hasattr(rel, "parent"):
            for name, e in zip(rel.children, rel.child_extents(ext[rel.parent])):
                ext[name] = e
        else:
            ext[rel.fused] = math.prod(ext[c] for c in rel.children)
    return ext


def root_axis_of(stage, name: str) -> str:
    """The original axis an iterator was derived from (through splits; for a fused iterator,
    through its innermost part)."""
    parent = {c: rel.parent for rel in stage.relations if hasattr(rel, "parent") for c in rel.children}
    innermost_part = {rel.fused: rel.children[-1] for rel in stage.relations if not hasattr(rel, "parent")}
    while name in parent or name in innermost_part:
        name = parent.get(name) or innermost_part[name]
    return name


def root_axes_of(stage, name: str) -> set[str]:
    """Every original axis an iterator covers (all parts of a fused one, through splits)."""
    for rel in stage.relations:
        if hasattr(rel, "parent") and name in rel.children:
            return root_axes_of(stage, rel.parent)
        if not hasattr(rel, "parent") and rel.fused == name:
            return set().union(*(root_axes_of(stage, c) for c in rel.children))
    return {name}


def leaf_expressions(stage, leaf_values: dict[str, E.Expr], root_extents: dict[str, int]):
    """Express each root axis through the leaf iterators' values.

    Returns (values by root axis name, guard conditions, extents of every iterator). A guard
    appears for each split whose pieces cover more than its parent (a non-divisible split).
    """
    ext = iterator_extents(stage, root_extents)
    values = dict(leaf_values)
    guards: list[E.Expr] = []
    for rel in reversed(stage.relations):
        if hasattr(rel, "parent"):
            if rel.inner_to_outer:
                strides = rel.strides()
            else:
                strides, acc_ = [], 1
                for child in reversed(rel.children):
                    strides.append(acc_)
                    acc_ *= ext[child]
                strides.reverse()
            acc = None
            span = 1  # number of parent values the loops can reach
            for child, stride in zip(reversed(rel.children), reversed(strides)):
                term = values[child] if stride == 1 else values[child] * stride
                acc = term if acc is None else term + acc
                span += (ext[child] - 1) * stride
            values[rel.parent] = acc
            if span > ext[rel.parent]:
                guards.append(acc < ext[rel.parent])
        else:
            fused = values[rel.fused]
            strides = []
            stride = 1
            for child in reversed(rel.children):
                strides.append(stride)
                stride *= ext[child]
            strides.reverse()
            for k, child in enumerate(rel.children):
                v = fused if strides[k] == 1 else fused // strides[k]
                values[child] = v if k == 0 else v % ext[child]
    return values, guards, ext
