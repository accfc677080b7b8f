"""Sketch generation and random annotation: the rules fire where they should, and every sketch,
randomly annotated many times, computes what numpy computes."""

from __future__ import annotations

import itertools
import math
import random
import re

import pytest

import ansor
from ansor.measure import Builder, MeasureErrorNo, check_outputs
from ansor.measure.run import evaluate_kernel
from ansor.backend import generate_source
from ansor.lower.lower import schedule_text
from ansor.search.annotate import annotate, factorizations
from ansor.search.annotate_gpu import annotate_program
from ansor.search.sketch import Cond, SketchRule
from ansor.search.sketch_policy import SketchPolicy
from ansor.workloads import make_task_tensors

SMALL = {
    "matmul": ((24, 20, 16), {}),
    "matmul_bias_relu": ((24, 20, 16), {}),
    "conv2d": ((1, 3, 9, 9, 4, 3, 3), {"padding": 1}),
    "conv2d_bias_relu": ((1, 3, 9, 9, 4, 3, 3), {"padding": 1}),
    "depthwise_conv2d": ((1, 4, 9, 9, 3, 3), {"padding": 1}),
    "conv2d_transpose": ((1, 4, 4, 4, 3, 4, 4), {"stride": 2, "padding": 1}),
    "norm2": ((12, 10), {}),
    "softmax": ((6, 20), {}),
    "layer_norm": ((6, 20), {}),
    "layer_norm_gelu": ((6, 20), {}),
    "max_pool2d": ((1, 8, 9, 9, 3), {"stride": 2, "padding": 1}),
    "avg_pool2d": ((1, 8, 8, 8, 2), {}),
}
ANNOTATIONS_PER_SKETCH = 12  # programs compiled and checked per sketch (a third of the suite's time at 20)


def small_task(name: str) -> ansor.Task:
    shape, opts = SMALL[name]
    return ansor.Task(make_task_tensors(name, shape, **opts), name=name)


def histories(name: str) -> list[str]:
    return [" ".join(s.history) for s in SketchPolicy(small_task(name), seed=0).sketches]


def test_matmul_sketches_cache_write_fusion_levels_and_packing():
    h = histories("matmul")
    assert len(h) == 6
    assert sum("add_cache_write(matmul)" in x for x in h) == 4
    assert sum("fused at level 1" in x for x in h) == 2 and sum("fused at level 2" in x for x in h) == 2
    assert sum(x.startswith("multi_level_tiling(matmul") for x in h) == 2
    assert sum("inputs packed" in x for x in h) == 3


@pytest.mark.parametrize("name, producer", [("matmul_bias_relu", "matmul"), ("conv2d_bias_relu", "conv2d")])
def test_fusible_consumer_is_fused(name, producer):
    h = histories(name)
    assert all("always_inline(bias_add)" in x for x in h)
    assert sum(f"multi_level_tiling_with_fusion({producer}, fused at level 1" in x for x in h) >= 1
    assert sum(f"multi_level_tiling_with_fusion({producer}, fused at level 2" in x for x in h) >= 1
    assert not any("add_cache_write" in x for x in h)  # a fusible consumer makes the cache useless


def test_norm2_gets_rfactor():
    h = histories("norm2")
    assert sum("add_rfactor(norm2_sum_sq" in x for x in h) == 2
    assert len(h) == 3


def test_a_pooling_window_can_run_outside_the_channels(tmp_path):
    """NHWC pooling: the window loops go outside the innermost (channel) axis, which is then
    the vector loop; the sketch's programs compute what numpy computes (checked above for the
    named pools, here for the channels-last form the graph pass makes)."""
    from ansor.graph.ir import Graph
    from ansor.graph.model_tasks import extract_tasks

    g = Graph()
    x = g.add_input("x", (1, 9, 9, 16), "float32")
    g.outputs = [g.add_node("max_pool2d", [x], {"kernel": (3, 3), "stride": (2, 2),
                                                "padding": (1, 1), "layout": "NHWC"})]
    task = extract_tasks(g, simplify=False).tasks[0]
    policy = SketchPolicy(task, seed=0)
    sketch = next(s for s in policy.sketches if any("reduction_outside_innermost" in h for h in s.history))
    rng = random.Random(5)
    st = next(st for st in (annotate(sketch.steps, task.dag, rng, policy.params, 2)
                            for _ in range(50)) if st is not None)
    text = schedule_text(st)
    channel_loop = re.search(r"\w+ c(\.\w+)? in range", text)
    assert channel_loop and text.index("for ry") < channel_loop.start()  # channels inside the window
    src, fname = generate_source(st, task.target, "kernel")
    inputs = task.random_inputs(seed=0)
    (build,) = Builder(cache_dir=tmp_path).build([src])
    r = evaluate_kernel(build.lib_path, fname, inputs, task.reference_outputs(inputs),
                        timing=_no_timing())
    assert r.error_no == MeasureErrorNo.NO_ERROR, r.error_msg


def test_sketch_counts_stay_small():
    for name in SMALL:
        assert 1 <= len(histories(name)) <= 10, name


def test_a_chain_of_many_tiled_stages_still_gets_sketches():
    """Five chained matrix products: every stage has several tiled variants, so the partial
    sketches multiply past the cap long before any is complete. The derivation goes on with
    a spread-out share of them instead of stopping with none."""
    from ansor import te

    x = te.placeholder((16, 16), name="x")
    y, weights = x, []
    for i in range(5):
        w = te.placeholder((16, 16), name=f"w{i}")
        k = te.reduce_axis(16, f"k{i}")
        y = te.compute((16, 16), lambda a, b, y=y, w=w, k=k: te.sum(y[a, k] * w[k, b], axis=[k]), name=f"mm{i}")
        weights.append(w)
    sketches = SketchPolicy(ansor.Task([x, *weights, y], name="chain"), seed=0).sketches
    assert len({" ".join(s.history) for s in sketches}) > 1


def test_every_annotated_program_is_traced_to_its_own_sketch():
    from ansor.search.sketch_policy import sketch_index, sketch_structure

    for name in ("conv2d_bias_relu", "max_pool2d", "matmul"):
        policy = SketchPolicy(small_task(name), seed=0)
        prefixes = [sketch_structure(s.steps) for s in policy.sketches]
        for k, sketch in enumerate(policy.sketches):
            for _ in range(5):
                program = annotate_program(sketch.steps, policy.task.dag, policy.rng, policy.params,
                                           policy.hardware)
                assert program is None or sketch_index(program, prefixes) == k, (name, k)


def test_a_program_of_an_amx_sketch_is_traced_to_it_not_to_its_vector_twin():
    """The AMX sketch differs from the vector one only in the split lengths it fixes."""
    from ansor import te
    from ansor.search.sketch_policy import sketch_index, sketch_structure
    from ansor.target import Target

    a = te.placeholder((64, 256), "uint8", name="a")
    b = te.placeholder((256, 64), "int8", name="b")
    k = te.reduce_axis(256, "k")
    c = te.compute((64, 64), lambda i, j: te.sum(te.cast(a[i, k], "int32") * te.cast(b[k, j], "int32"), axis=k),
                   name="c")
    target = Target.cpu("avx512", 2, ("avx512_vnni", "amx_tile", "amx_int8"))
    policy = SketchPolicy(ansor.Task([a, b, c], target=target, name="int8_matmul"), seed=0)
    try:
        amx = [n for n, s in enumerate(policy.sketches) if "tdpbusd" in " ".join(s.history)]
        assert amx
        prefixes = [sketch_structure(s.steps) for s in policy.sketches]
        for k in range(len(policy.sketches)):
            for _ in range(5):
                program = annotate_program(policy.sketches[k].steps, policy.task.dag, policy.rng, policy.params,
                                           policy.hardware)
                assert program is None or sketch_index(program, prefixes) == k or k not in amx, k
    finally:
        policy.close()


def test_a_first_round_measures_the_best_program_of_every_sketch():
    """Nothing of the task measured yet: whatever the model thinks of a whole sketch, the
    round's picks start with one program of each (the model's best of it)."""
    from ansor.search.sketch_policy import sketch_index, sketch_structure

    class CountsStoredBuffers:  # rates whole sketches (those with more stages) above others
        def predict(self, feats):
            return [float(f.shape[0]) for f in feats]

    policy = SketchPolicy(small_task("max_pool2d"), seed=0, cost_model=CountsStoredBuffers(),
                          params={"evolutionary_search_population": 256, "evolutionary_search_num_iters": 1})
    prefixes = [sketch_structure(s.steps) for s in policy.sketches]
    picks = policy.next_batch(8, set())
    assert {sketch_index(p, prefixes) for p in picks[:len(policy.sketches)]} == set(range(len(policy.sketches)))


def test_custom_rule_runs_before_builtin_rules():
    def condition(ctx, state, sid):
        st = state.stages[sid]
        return Cond.APPLY_AND_SKIP_REST if st.name == "matmul" and st.is_fresh else Cond.SKIP

    def action(ctx, state, sid):
        s = state.copy()
        s.split(sid, 0, [None])
        return [(s, sid - 1)]

    task = small_task("matmul")
    policy = SketchPolicy(task, seed=0, custom_rules=[SketchRule("my_split", condition, action)])
    assert [s.history for s in policy.sketches] == [["my_split(matmul)"]]
    programs = policy.sample(5)
    assert programs and all(any("i.0" in it.name for it in p.stage("matmul").iters) for p in programs)


def test_factorizations_are_perfect_and_bounded():
    for extent, n, bound in [(1024, 3, 64), (96, 2, 16), (7, 3, 64), (1, 2, 4)]:
        tuples = factorizations(extent, n, bound)
        assert tuples
        for t in tuples:
            assert len(t) == n and t[-1] <= bound
            prod = 1
            for f in t:
                prod *= f
            assert extent % prod == 0


def test_sampling_is_reproducible_and_distinct():
    a = [s.key() for s in SketchPolicy(small_task("conv2d"), seed=7).sample(30)]
    b = [s.key() for s in SketchPolicy(small_task("conv2d"), seed=7).sample(30)]
    assert a == b
    assert len(set(a)) == len(a)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_sketch_annotated_matches_numpy(name, tmp_path):
    task = small_task(name)
    policy = SketchPolicy(task, seed=0)
    rng = random.Random(1234)
    programs = []
    for sketch in policy.sketches:
        made, tries = 0, 0
        while made < ANNOTATIONS_PER_SKETCH and tries < 200:
            tries += 1
            st = annotate(sketch.steps, task.dag, rng, policy.params, task.target.num_cores)
            if st is not None:
                programs.append(st)
                made += 1
        assert made == ANNOTATIONS_PER_SKETCH, f"{name}: sketch {sketch.history} rarely annotates"
    assert_programs_match_numpy(task, programs, tmp_path)


def test_an_awkward_extent_is_also_tiled_padded_and_the_guarded_tail_matches_numpy(tmp_path):
    """A prime extent (a ViT's 197 tokens, here 37) has no register-sized perfect tiling; its
    draws also tile the next multiple of 8 (`padded_extent`), which lowering guards. Those
    programs, and their tile-size mutations, compute the same as numpy."""
    from ansor.schedule.steps import SplitStep
    from ansor.search.annotate import padded_extent
    from ansor.search.evolution import mutate_tile_size

    assert [padded_extent(n) for n in (37, 197, 196, 13, 49, 1000)] == [40, 200, 196, 13, 49, 1000]
    task = ansor.Task(make_task_tensors("matmul", (37, 20, 32)), name="matmul")
    policy = SketchPolicy(task, seed=3)
    rng = random.Random(5)

    def padded(st) -> bool:
        splits = [s for s in st.steps if isinstance(s, SplitStep) and s.extent == 37]
        return any(37 % math.prod(s.lengths) and 40 % math.prod(s.lengths) == 0 for s in splits)

    programs = [st for st in policy.sample(60) if padded(st)][:6]
    assert len(programs) == 6
    mutants = [m for m in (mutate_tile_size(st, rng, policy.params) for st in programs * 4) if m is not None]
    programs += [m for m in mutants if padded(m)][:4]
    assert_programs_match_numpy(task, programs, tmp_path)


def test_an_extent_that_padding_barely_lengthens_is_always_tiled_padded():
    """197 -> 200 adds 1.5%: every draw tiles 200 (its unpadded tilings are one-row tiles);
    37 -> 40 adds 8%: both kinds are drawn."""
    from ansor.search.annotate import tiled_extent

    rng = random.Random(0)
    assert {tiled_extent(197, rng) for _ in range(200)} == {200}
    assert {tiled_extent(37, rng) for _ in range(200)} == {37, 40}
    assert {tiled_extent(196, rng) for _ in range(20)} == {196}


def assert_programs_match_numpy(task, programs, tmp_path) -> None:
    """Compile every program and check its outputs against the task's numpy reference."""
    sources = [generate_source(st, task.target, "kernel") for st in programs]
    builds = Builder(cache_dir=tmp_path).build([src for src, _ in sources])
    inputs = task.random_inputs(seed=0)
    expected = task.reference_outputs(inputs)
    for st, (src, fname), b in zip(programs, sources, builds):
        assert b.error_no == MeasureErrorNo.NO_ERROR, b.error_msg
        r = evaluate_kernel(b.lib_path, fname, inputs, expected, timing=_no_timing())
        assert r.error_no == MeasureErrorNo.NO_ERROR, f"{r.error_msg}\n{st}"

def _no_timing():
    from ansor.measure import TimingPolicy

    return TimingPolicy(warmup=0, repeat=1, min_repeat_ms=0.0)


def test_check_outputs_is_what_the_space_test_relies_on():
    import numpy as np

    assert check_outputs([np.ones(3, "float32")], [np.ones(3, "float32")]) is None
    assert check_outputs([np.zeros(3, "float32")], [np.ones(3, "float32")]) is not None


def test_long_untiled_innermost_loops_are_split_and_vectorized():
    """An elementwise stage over 768 columns cannot vectorize the whole row (at most 64 lanes):
    annotation splits the row and vectorizes the inner piece, a divisor of 768."""
    task = ansor.Task(make_task_tensors("gelu", (8, 768)), name="gelu")
    policy = SketchPolicy(task, seed=3)
    for state in policy.sample(12):
        out = state.stages[-1]
        vec = [it for it in out.iters if it.annotation == "vectorize"]
        assert len(vec) == 1 and 1 < vec[0].extent <= 64 and 768 % vec[0].extent == 0


def test_register_tiles_put_the_whole_reduction_around_the_innermost_tile():
    """With register_tile_prob 1 (and no blocked tiles) every multi-level-tiled spatial axis has
    its second innermost level 1 (so R0 R1 sit right around S3), reduction splits keep their
    sampled lengths, and the innermost tile fits three quarters of the vector registers
    (AVX-512 and AVX2). Blocked tiles are tested in test_evolution."""
    from ansor.schedule.steps import SplitStep
    from ansor.search.annotate import register_level_splits

    task = ansor.Task(make_task_tensors("conv2d", (1, 8, 12, 12, 16, 3, 3), padding=1), name="conv2d")
    policy = SketchPolicy(task, seed=5, params={"register_tile_prob": 1.0, "blocked_register_tile_prob": 0.0})
    rng = random.Random(0)
    reduce_lengths = set()
    for sketch in policy.sketches:
        register = register_level_splits(sketch.steps)
        undecided = [i for i, s in enumerate(sketch.steps)
                     if isinstance(s, SplitStep) and None in s.lengths]
        assert register and set(register) < set(undecided)
        for _, (lanes, registers) in itertools.product(range(5), [(16, 32), (8, 16)]):
            st = annotate(sketch.steps, task.dag, rng, policy.params, 2, lanes, registers)
            assert st is not None
            tile = 1
            for i in undecided:
                if i in register:
                    assert st.steps[i].lengths[-2] == 1
                    tile *= st.steps[i].lengths[-1]
                else:
                    reduce_lengths.add(st.steps[i].lengths)
            assert tile <= (3 * registers // 4) * lanes
    assert any(lengths != (1,) for lengths in reduce_lengths)


def test_register_tiles_fill_whole_vectors_on_the_vectorized_loop():
    """A register tile's innermost loop (the one annotation vectorizes: output columns, or
    channels where the weights are packed) takes a multiple of the vector lanes, so the tile is
    made of full vectors, never of scalars."""
    task = ansor.Task(make_task_tensors("conv2d", (1, 8, 16, 16, 16, 3, 3), padding=1), name="conv2d")
    policy = SketchPolicy(task, seed=5, params={"register_tile_prob": 1.0})
    rng = random.Random(1)
    for sketch in policy.sketches:
        for lanes, registers in [(16, 32), (8, 16)]:
            for _ in range(4):
                st = annotate(sketch.steps, task.dag, rng, policy.params, 2, lanes, registers)
                assert st is not None
                conv = next(s for s in st.stages if not s.is_placeholder and s.op.reduce_axes
                            and s.iters and s.iters[-1].kind == "spatial")
                assert conv.iters[-1].annotation == "vectorize"
                assert conv.iters[-1].extent % lanes == 0, schedule_text(st)


def test_row_statistics_can_be_computed_inside_the_output_row_loop(tmp_path):
    """LayerNorm's mean is read by the variance and by the output. Once the variance (and its
    rfactor partial sums) sit inside the output's row loop, the mean and its partial sums may
    go there too: the row is then read from memory once. Random annotation reaches that
    program, and it matches numpy."""
    task = small_task("layer_norm_gelu")
    policy = SketchPolicy(task, seed=0)
    rng = random.Random(2)
    out_name = task.dag.outputs[0].op.name
    fused = []
    for _ in range(600):
        st = annotate(rng.choice(policy.sketches).steps, task.dag, rng, policy.params, 2)
        if st is None:
            continue
        stats = [s for s in st.stages if s.name.startswith("layer_norm_")]  # not the inlined layer_norm
        if (all(isinstance(s.attach, tuple) for s in stats) and st.stage("layer_norm_mean").attach[0] == out_name
                and any(s.name.endswith(".rf") for s in stats)):
            fused.append(st)
    assert fused, "no sample computes every row statistic inside the output's loops"
    st = fused[0]
    src, fname = generate_source(st, task.target, "kernel")
    build = Builder(cache_dir=tmp_path).build([src])[0]
    assert build.error_no == MeasureErrorNo.NO_ERROR, build.error_msg
    inputs = task.random_inputs(seed=0)
    r = evaluate_kernel(build.lib_path, fname, inputs, task.reference_outputs(inputs), timing=_no_timing())
    assert r.error_no == MeasureErrorNo.NO_ERROR, f"{r.error_msg}\n{st}"


def _fully_fused_share(task: ansor.Task, fused_prob: float, n: int = 300) -> float:
    """Share of random programs in which no stage but the output is computed at the root."""
    policy = SketchPolicy(task, seed=0, params={"fused_location_prob": fused_prob})
    rng = random.Random(5)
    fused = total = 0
    for _ in range(n):
        st = annotate(rng.choice(policy.sketches).steps, task.dag, rng, policy.params, 2)
        if st is None:
            continue
        total += 1
        fused += not any(s.attach == "root" and not s.is_placeholder and not st.is_output(i)
                         for i, s in enumerate(st.stages))
    return fused / total


def test_the_joint_location_draw_makes_fused_row_statistics_common():
    """Drawn stage by stage, LayerNorm's four statistics rarely all land in the output's row
    loop; the per-program draw puts the free reductions (and the free stages after them) into
    consumer loops in a share of the programs, so the fused program is common (and the
    per-stage draw remains for the rest)."""
    task = small_task("layer_norm_gelu")
    alone, joint = _fully_fused_share(task, 0.0), _fully_fused_share(task, 0.5)
    assert joint > alone + 0.25, (alone, joint)
    assert _fully_fused_share(task, 1.0) == 1.0


@pytest.mark.parametrize("name", ["conv2d", "matmul_bias_relu"])
def test_programs_without_a_free_reduction_sample_as_without_the_joint_draw(name):
    """The coin is drawn at the first free reduction: a convolution (whose padding is the only
    free stage) samples the same programs for the same seed whatever the probability."""
    task = small_task(name)
    keys = [[p.key() for p in SketchPolicy(task, seed=3, params={"fused_location_prob": prob, "search_workers": 1})
             .sample(60, set())] for prob in (0.0, 0.9)]
    assert keys[0] == keys[1]


def test_a_reduction_is_not_offered_a_loop_that_recomputes_it():
    """The variance is read as var[i0] by the output: inside the output's row loop it is
    computed once per row, inside the column loop once per element. Only the row loop is a
    candidate; an elementwise producer keeps both."""
    from ansor.search.annotate import compute_location_candidates

    task = small_task("layer_norm_gelu")
    state = ansor.State(task.dag)
    state.compute_inline("layer_norm")
    out = state.stage_id("gelu")
    var = state.stage_id("layer_norm_var")
    assert compute_location_candidates(state, var) == [(out, 0)]
    from ansor import te

    X = te.placeholder((20,), name="X")
    Y = te.placeholder((6, 20), name="Y")
    P = te.compute((20,), lambda j: X[j] * 2.0, name="P")
    C = te.compute((6, 20), lambda i, j: P[j] + Y[i, j], name="C")
    s2 = ansor.State(ansor.Task([X, Y, C]).dag)
    assert len(compute_location_candidates(s2, s2.stage_id("P"))) == 2  # recomputing is its choice
