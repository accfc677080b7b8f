"""Tutorial 2: five convolutions, five winning programs, and how their structures differ.

A convolution is not one problem. An early ResNet layer has a large image and few channels, a
late one a 7x7 image and many channels, a 1x1 convolution is a matrix multiplication in
disguise, a depthwise convolution reduces over nine taps only, and the 7x7 stride-2 stem reads
three input channels. This script tunes each shape, takes the best program from the database
and reads its structure off the program itself (its schedule State: loops, annotations, attach
points and steps), then prints one table row per shape:

- tiling: the extent of every loop level of each axis (outermost first), e.g. ff 2.1.1.32;
- packed layout: a constant input copied into a tiled layout ahead of the calls;
- vector: the vectorized loop and its length;
- register tile: the spatial loops inside the innermost reduction loop (the accumulator tile);
- fused stages: which stages run inside which loop (compute_at), which are inlined;
- parallel: what the parallel loop is made of.

It says whether at least three different structures won, and for each shape, in one sentence,
where its structure departs from the most common one, next to the shape's own sizes. ansor's
kernel is also timed in turns with PyTorch eager on each shape.

    python examples/tutorial_2_conv2d.py                  # full-size layers, 24 trials each
    python examples/tutorial_2_conv2d.py --trials 200 --database convs.db
    python examples/tutorial_2_conv2d.py --small --trials 2     # tiny shapes (the smoke test)
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

import ansor
from ansor.compare import compare_calls, torch_calls
from ansor.schedule.state import Fuse, Split, Stage, State
from ansor.workloads import WORKLOADS, make_task, workload_options

# (label, workload, shape, options): the layers of ResNet-18/50 and MobileNet at batch 1
SHAPES = [
    ("early 3x3", "conv2d", (1, 64, 56, 56, 64, 3, 3), {"padding": 1}),
    ("late 3x3", "conv2d", (1, 512, 7, 7, 512, 3, 3), {"padding": 1}),
    ("1x1", "conv2d", (1, 256, 28, 28, 128, 1, 1), {"padding": 0}),
    ("depthwise 3x3", "depthwise_conv2d", (1, 128, 56, 56, 3, 3), {"padding": 1}),
    ("stem 7x7/2", "conv2d", (1, 3, 224, 224, 64, 7, 7), {"stride": 2, "padding": 3}),
]
# the same layers with few channels and small images: seconds instead of minutes
SMALL_SHAPES = [
    ("early 3x3", "conv2d", (1, 8, 14, 14, 8, 3, 3), {"padding": 1}),
    ("late 3x3", "conv2d", (1, 32, 7, 7, 32, 3, 3), {"padding": 1}),
    ("1x1", "conv2d", (1, 32, 14, 14, 16, 1, 1), {"padding": 0}),
    ("depthwise 3x3", "depthwise_conv2d", (1, 16, 14, 14, 3, 3), {"padding": 1}),
    ("stem 7x7/2", "conv2d", (1, 3, 32, 32, 8, 7, 7), {"stride": 2, "padding": 3}),
]
# what a program without one of the stages does instead
MISSING = {"where the reduction": "accumulates directly in the output (no cache stage)",
           "where a producer": "has no producer stage", "where a copy of an input": "copies no input"}
# what the loop names of te.ops.conv2d and depthwise_conv2d stand for
AXES = {"nn": "batch", "ff": "output channels", "yy": "output rows", "xx": "output columns",
        "rc": "input channels", "ry": "kernel rows", "rx": "kernel columns"}


@dataclass
class Structure:
    """The structure of one program, read off its State. `signature` leaves out the sizes (the
    tile extents, the vector length): two programs with equal signatures are the same structure
    with different numbers."""

    main: str                                   # the stage that does the reduction
    tiling: list[str] = field(default_factory=list)
    packed: list[str] = field(default_factory=list)
    vector: str = "none"
    register_tile: str = "none"
    fused: list[str] = field(default_factory=list)
    parallel: str = "none"
    unroll: int = 0
    signature: dict[str, str] = field(default_factory=dict)
    explain: dict[str, str] = field(default_factory=dict)  # signature part -> words for a sentence


def _extents(stage: Stage) -> dict[str, int]:
    """Every loop name the stage ever had (roots, split pieces, fused loops) -> its extent."""
    ext = {it.name: it.extent for it in stage.root_iters}
    for rel in stage.relations:
        if isinstance(rel, Split):
            for name, n in zip(rel.children, rel.child_extents(ext.get(rel.parent))):
                ext[name] = n
        elif isinstance(rel, Fuse):
            ext[rel.fused] = math.prod(ext.get(c) or 1 for c in rel.children)
    ext.update({it.name: it.extent for it in stage.iters})
    return ext


def _fused_parts(stage: Stage, name: str) -> list[str]:
    """The loops a fused loop was made of (itself when it was not fused)."""
    for rel in stage.relations:
        if isinstance(rel, Fuse) and rel.fused == name:
            return [p for c in rel.children for p in _fused_parts(stage, c)]
    return [name]


def _root(name: str) -> str:
    """The axis a loop comes from: ff.3 -> ff."""
    return name.split(".")[0]


def _level(name: str) -> str:
    """The tile level of a split loop (ff.1 -> 1); a fused loop's innermost part decides."""
    last = name.split("@")[-1]
    return last.split(".")[1] if "." in last else "0"


def structure(state: State) -> Structure:
    """Read the structure of a program off its State (see `Structure`)."""
    stages = [s for s in state.stages if not s.is_placeholder]
    reductions = [s for s in stages if any(it.kind == "reduce" for it in s.iters)]
    if not reductions:
        raise ValueError("the program has no reduction stage")
    main = max(reductions, key=lambda s: len(s.iters))  # the multi-level tiled one
    outer = main
    while isinstance(outer.attach, tuple):               # the loop nest it runs in
        outer = state.stage(outer.attach[0])
    st = Structure(main.name)
    ext = _extents(main)
    for rel in main.relations:
        if isinstance(rel, Split) and rel.parent in {it.name for it in main.root_iters}:
            st.tiling.append(f"{rel.parent} " + ".".join(str(ext[c]) for c in rel.children))
    # constant inputs copied into a tiled layout (cache_read "global" + transform_layout)
    for s in stages:
        if s.origin == "cache_read" and s.scope == "global":
            source = s.name.rsplit(".", 1)[0]
            if s.layout is not None:
                dim, factor = s.layout
                st.packed.append(f"{source} dim {dim} ({s.tensor.shape[dim]}) in tiles of {factor}")
            else:
                st.packed.append(f"{source} copied")
    st.signature["packed"] = ", ".join(p.split(" (")[0].split(" in tiles")[0] for p in st.packed) or "none"
    st.explain["packed"] = (f"packs {'; '.join(st.packed)} ahead of the calls" if st.packed
                            else "reads every input in its own layout")
    vec = [it for it in main.iters if it.annotation == "vectorize"]
    if vec:
        st.vector = f"{vec[0].name} x{vec[0].extent}"
    vec_axis = _root(vec[0].name) if vec else "none"
    st.signature["vector"] = vec_axis
    st.explain["vector"] = (f"vectorizes {vec_axis} ({AXES.get(vec_axis, vec_axis)}, {vec[0].extent} lanes)"
                            if vec else "has no vectorized loop in its reduction")
    # the accumulator tile: the spatial loops inside the innermost reduction loop
    last_reduce = max((i for i, it in enumerate(main.iters) if it.kind == "reduce"), default=-1)
    inner = [it for it in main.iters[last_reduce + 1:] if it.kind == "spatial" and (it.extent or 1) > 1]
    if last_reduce >= 0 and inner:
        points = math.prod(it.extent for it in inner)
        where = "in registers: a local cache stage" if main.scope == "local" else "in the output buffer"
        st.register_tile = " x ".join(f"{it.name} {it.extent}" for it in inner) + f" = {points} ({where})"
    tile_axes = " x ".join(_root(it.name) for it in inner) or "none"
    st.signature["tile"] = tile_axes
    st.explain["tile"] = (f"accumulates a tile of {' x '.join(f'{_root(it.name)} {it.extent}' for it in inner)} "
                          f"per reduction step" if inner else "keeps no accumulator tile inside the reduction")
    # where every other stage runs
    roles = {main.name: "the reduction", outer.name: "the output"}
    for s in stages:
        if s is main and s is outer:
            continue
        if s.attach == "inline":
            text, kind, verb = f"{s.name} inlined", "inlined", "inlines"
        elif isinstance(s.attach, tuple):
            host, loop = s.attach
            text, verb = f"{s.name} at {host}.{loop}", "computes"
            kind = f"inside {roles.get(host, host)} at tile level {_level(loop)}"
        else:
            text, kind, verb = f"{s.name} separate", "as a separate loop nest", "computes"
        st.fused.append(text)
        if s is outer:
            continue
        role = ("the reduction" if s is main else "a copy of an input" if s.origin == "cache_read"
                else "a producer")
        st.signature[f"where {role}"] = kind
        if s is main:
            st.explain[f"where {role}"] = f"accumulates in a cache stage ({s.name}) computed {kind}"
        else:
            st.explain[f"where {role}"] = f"{verb} {role} ({s.name})" + ("" if kind == "inlined" else f" {kind}")
    # the parallel loop of the outer nest, as the axes it splits
    par = [it for it in outer.iters if it.annotation == "parallel"]
    oext = _extents(outer)
    parts = [p for p in _fused_parts(outer, par[0].name) if (oext.get(p) or 1) > 1] if par else []
    if parts:
        st.parallel = " x ".join(f"{p} {oext[p]}" for p in parts) + f" = {par[0].extent} chunks"
        st.signature["parallel"] = " x ".join(dict.fromkeys(_root(p) for p in parts))
        axes = list(dict.fromkeys(AXES.get(_root(p), _root(p)) for p in parts))
        st.explain["parallel"] = f"runs {par[0].extent} parallel chunks over {' x '.join(axes)}"
    else:  # no parallel loop, or one of a single iteration (the search may choose that)
        st.parallel = f"one thread ({par[0].name} has 1 iteration)" if par else "one thread (no parallel loop)"
        st.signature["parallel"] = "none"
        st.explain["parallel"] = "runs on one thread"
    st.unroll = max(s.auto_unroll_max_step for s in stages)
    return st


def shape_facts(task: ansor.Task) -> str:
    """The sizes that decide a structure: output channels x rows x columns, reduction length."""
    out = task.outputs[0].shape
    red = math.prod(ax.extent for ax in task.outputs[0].op.reduce_axes)
    return f"{out[1]} channels x {out[2]}x{out[3]} output, {red} multiply-adds per output"


def why_sentences(rows: list[tuple[str, ansor.Task, Structure]]) -> list[str]:
    """One sentence per shape: where its structure departs from the most common value of each
    part among the shapes, beside its sizes (facts only: nothing here is written per shape)."""
    keys = list(rows[0][2].signature)
    for _, _, s in rows[1:]:
        keys += [k for k in s.signature if k not in keys]
    common: dict[str, str | None] = {}  # a part's most common value; None when no value is
    for k in keys:                       # shared by two shapes more often than any other
        counts = Counter(s.signature.get(k, "absent") for _, _, s in rows).most_common()
        unique_top = len(counts) == 1 or counts[0][1] > counts[1][1]
        common[k] = counts[0][0] if counts[0][1] >= 2 and unique_top else None
    out = []
    for label, task, s in rows:
        diffs = [s.explain[k] for k in keys
                 if s.signature.get(k, "absent") != common[k] and k in s.explain]
        missing = [k for k in keys if k not in s.signature and common[k] not in ("absent", None)]
        diffs += [MISSING.get(k, f"has no {k}") for k in missing]
        facts = shape_facts(task)
        if diffs:
            out.append(f"{label} ({facts}): unlike the most common choice, it " + "; it ".join(diffs) + ".")
        else:
            out.append(f"{label} ({facts}): the most common structure; it " + s.explain["vector"] + " and "
                       + s.explain["parallel"] + ".")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=24, help="programs measured per shape (default 24)")
    parser.add_argument("--database", default=None,
                        help="records database (default: a temporary file, removed at the end)")
    parser.add_argument("--small", action="store_true", help="few channels, small images (default: full size)")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds against PyTorch (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the search (default 0)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.database or os.path.join(tmp, "convs.db")
        run(args, db)


def run(args: argparse.Namespace, db: str) -> None:
    from ansor.report import console

    shapes = SMALL_SHAPES if args.small else SHAPES
    host = ansor.Target.host()
    print(f"{len(shapes)} convolutions on {host.key}, {args.trials} trials each; records: {db}")
    rows = []
    for label, workload, shape, options in shapes:
        task = make_task(workload, shape, **options)
        start = time.time()
        result = ansor.tune(task, trials=args.trials, database=db, seed=args.seed, progress=False)
        kernel = ansor.build(task, database=db)
        s = structure(kernel.state)
        rows.append((label, task, s))
        inputs = task.random_inputs(seed=1)
        opts = workload_options(workload, shape, **options)
        torch_fn = WORKLOADS[workload].torch_fn
        calls, notes = torch_calls(lambda *xs, fn=torch_fn, o=opts: fn(o, *xs), inputs, skip=("torch.compile",))
        cmp = compare_calls(label, task.flop, kernel.prepared(*inputs), task.reference_outputs(inputs),
                            calls, notes, rounds=args.rounds)
        dims = "x".join(map(str, shape))
        print(f"{label:14s} {workload} {dims} {options}: tuned {result.trials} programs in "
              f"{time.time() - start:.0f} s; best {cmp.gflops(cmp.ansor):.1f} GFLOP/s in this run")
        for line in cmp.lines():
            print(f"{'':14s} {line}")
    from rich.table import Table

    table = Table(title="the winning structures, read off each best program", show_lines=True)
    table.add_column("shape")
    table.add_column("structure")
    for label, task, s in rows:
        facts = [("tiling", ", ".join(s.tiling)), ("packed layout", "; ".join(s.packed) or "none"),
                 ("vector", s.vector), ("register tile", s.register_tile), ("fused stages", ", ".join(s.fused)),
                 ("parallel", s.parallel), ("unroll", f"auto-unroll up to {s.unroll} steps" if s.unroll else "none")]
        table.add_row(label, "\n".join(f"{k:13s} {v}" for k, v in facts))
    console.print(table)
    print("loop names: " + ", ".join(f"{k} {v}" for k, v in AXES.items()) + "; a.b is level b of axis a, "
          "x@y a fused loop")
    kinds = Counter(tuple(sorted(s.signature.items())) for _, _, s in rows)
    n = len(kinds)
    print(f"different winning structures: {n} of {len(rows)} shapes "
          f"({'at least three' if n >= 3 else 'fewer than three'}; sizes aside: packing, vector axis, "
          f"register tile axes, where each stage runs, parallel axes)")
    for sentence in why_sentences(rows):
        print(f"- {sentence}")


if __name__ == "__main__":
    main()
