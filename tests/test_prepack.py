"""Constant inputs (weights): stages computed from them alone run once, ahead of the calls
(`<kernel>_prepack`), and the kernel reads their packed buffers."""

from __future__ import annotations

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.costmodel.features import extract_features
from ansor.lower.lower import lower
from ansor.kernel import compile_state
from ansor.measure import evaluate_kernel
from ansor.schedule.state import State
from helpers import assert_close


def conv_task(constant: bool) -> ansor.Task:
    x = te.placeholder((1, 8, 10, 10), name="data")
    w = te.placeholder((16, 8, 3, 3), name="weight", constant=constant)
    return ansor.Task([x, w, te.ops.conv2d(x, w, padding=1)], name="conv")


def packed_state(task: ansor.Task) -> State:
    """The convolution tiled with its output channels innermost and the weight copied into a
    layout tiled by 8 channels (what the sketch rules build for NCHW convolutions)."""
    s = State(task.dag)
    conv = s.stage_id("conv2d")
    s.compute_inline(s.stage_id("conv2d_pad"))
    s.reorder(conv, ["nn", "yy", "xx", "ff", "rc", "ry", "rx"])
    split = len(s.steps)
    s.split(conv, "ff", [8])
    s.reorder(conv, ["nn", "yy", "xx", "ff.0", "rc", "ry", "rx", "ff.1"])
    s.annotate(conv, "ff.1", "vectorize")
    copy = s.cache_read(s.stage_id("weight"), "global", [conv])
    s.transform_layout(copy, 0, split, 0)  # weight[ff, ...] stored as [ff // 8, ..., ff % 8]
    return s


def test_a_constant_input_is_part_of_the_workload_key():
    assert conv_task(True).workload_key != conv_task(False).workload_key
    assert "constant" in repr(conv_task(True).dag)


def test_the_weight_copy_moves_to_the_prepack_function():
    func = lower(packed_state(conv_task(True)))
    prepack = func.attrs["prepack"]
    packed = [b for b in func.params if b.role == "packed"]
    assert len(packed) == 1 and packed[0].shape[-1] == 8
    assert prepack.params == func.params
    read_in_kernel = {n.buffer.name for n in _loads(func.body)}
    assert "weight" not in read_in_kernel and packed[0].name in read_in_kernel
    assert {n.buffer.name for n in _loads(prepack.body)} == {"weight"}
    # the same program on a non-constant weight copies it in every call
    plain = lower(packed_state(conv_task(False)))
    assert "prepack" not in plain.attrs and all(b.role != "packed" for b in plain.params)


def test_features_describe_the_kernel_without_the_packing():
    constant = extract_features(lower(packed_state(conv_task(True))))
    plain = extract_features(lower(packed_state(conv_task(False))))
    assert len(plain) == len(constant) + 1  # one row per stored buffer: the copy is not timed


def test_a_packed_kernel_matches_numpy_called_bound_and_measured(builder):
    task = conv_task(True)
    kernel = compile_state(task, packed_state(task), builder=builder)
    assert kernel.packs_ahead and kernel.constant_inputs == ["weight"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 10, 10), dtype=np.float32)
    w = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    ref = task.reference_outputs([x, w])[0]
    assert_close(kernel(x, w), ref)
    w2 = np.ascontiguousarray(-2 * w)  # a plain call packs its weight every time
    assert_close(kernel(x, w2), task.reference_outputs([x, w2])[0])
    bound = kernel.bind(weight=w)
    original = w.copy()
    w[...] = 0  # bind copied the weight
    assert_close(bound(x), ref)
    x2 = rng.standard_normal((1, 8, 10, 10), dtype=np.float32)
    assert_close(bound(x2), task.reference_outputs([x2, original])[0])
    res = evaluate_kernel(kernel.lib_path, kernel.func_name, [x, w2], task.reference_outputs([x, w2]))
    assert res.error_no == 0 and len(res.costs) >= 1
    assert kernel.time(x, w2) > 0 and kernel.time(x, w2, include_prepack=True) > 0


def test_bind_names_every_constant_and_only_those(builder):
    task = conv_task(True)
    kernel = compile_state(task, packed_state(task), builder=builder)
    with pytest.raises(TypeError, match="not a constant input"):
        kernel.bind(data=np.zeros((1, 8, 10, 10), np.float32))
    with pytest.raises(TypeError, match="missing weight"):
        kernel.bind()
    with pytest.raises(ValueError, match="expected shape"):
        kernel.bind(weight=np.zeros((16, 8, 3), np.float32))
    bound = kernel.bind(weight=np.zeros((16, 8, 3, 3), np.float32))
    with pytest.raises(TypeError, match="takes 1 inputs"):
        bound()


def _loads(stmt) -> list:
    from ansor.lower import ir
    from ansor.te import expr as E

    out = []

    def visit(node):
        if isinstance(node, ir.BufferLoad):
            out.append(node)
        if isinstance(node, E.Expr):
            for c in node.children():
                visit(c)
            return
        for name in ("body", "then", "orelse", "value", "cond"):
            child = getattr(node, name, None)
            if child is not None:
                visit(child)
        for child in getattr(node, "stmts", ()):
            visit(child)
        for idx in getattr(node, "indices", ()):
            visit(idx)

    visit(stmt)
    return out


def test_bind_with_the_weight_listed_first(builder):
    x = te.placeholder((1, 8, 10, 10), name="data")
    w = te.placeholder((16, 8, 3, 3), name="weight", constant=True)
    task = ansor.Task([w, x, te.ops.conv2d(x, w, padding=1)], name="conv")
    kernel = compile_state(task, packed_state(task), builder=builder)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((1, 8, 10, 10), dtype=np.float32)
    ws = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    ref = task.reference_outputs([ws, xs])[0]
    assert_close(kernel(ws, xs), ref)
    assert_close(kernel.bind(weight=ws)(xs), ref)


def test_a_prepared_call_packs_once_or_every_time_and_matches_numpy(builder):
    task = conv_task(True)
    kernel = compile_state(task, packed_state(task), builder=builder)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 10, 10), dtype=np.float32)
    w = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    ref = task.reference_outputs([x, w])[0]
    once = kernel.prepared(x, w)
    every = kernel.prepared(x, w, include_prepack=True)
    w[...] = 0  # prepared() copied its inputs
    for _ in range(2):
        assert_close(once()[0], ref)
        assert_close(every()[0], ref)
