"""A task's same-structure siblings: their programs fitted to its shapes, correct, and offered
first in a job of several tasks."""

from __future__ import annotations

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.kernel import build as build_kernel
from ansor.search.sketch_policy import SketchPolicy
from ansor.tuning.callbacks import TuningCallback
from ansor.tuning.options import TuneOptions
from ansor.tuning.siblings import SiblingPrograms, fit_lengths, fit_program, structure_key


def conv_relu_task(channels: int, size: int, out_channels: int) -> ansor.Task:
    x = te.placeholder((1, channels, size, size), "float32", name="x")
    w = te.placeholder((out_channels, channels, 3, 3), "float32", name="w", constant=True)
    y = te.ops.relu(te.ops.conv2d(x, w, stride=1, padding=1))
    return ansor.Task([x, w, y])


def matmul_task(m: int, n: int, k: int) -> ansor.Task:
    a = te.placeholder((m, k), "float32", name="A")
    b = te.placeholder((k, n), "float32", name="B", constant=True)
    r = te.reduce_axis(k, name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return ansor.Task([a, b, c])


def test_lengths_kept_when_exact_else_refitted_from_the_innermost():
    assert fit_lengths((4, 16), 128) == (4, 16)             # 64 divides 128: kept
    assert fit_lengths((4, 16), 48) == (3, 16)              # the vector tile kept, the outer shrinks
    assert fit_lengths((2, 8, 16), 28) == (1, 2, 14)        # 16 does not divide 28: the largest that does
    assert fit_lengths((None, 16), 100) == (None, 16)       # a sketch's open length is left open
    for lengths, extent in [((4, 16), 48), ((2, 8, 16), 28), ((7, 3), 5)]:
        fitted = fit_lengths(lengths, extent)
        assert extent % int(np.prod(fitted)) == 0 and all(f <= l for f, l in zip(fitted, lengths))


def test_structure_groups_the_same_layer_at_other_sizes_only():
    assert structure_key(conv_relu_task(8, 14, 16).dag) == structure_key(conv_relu_task(16, 7, 32).dag)
    assert structure_key(conv_relu_task(8, 14, 16).dag) != structure_key(matmul_task(32, 32, 32).dag)


@pytest.mark.parametrize("make", [lambda: (conv_relu_task(8, 16, 16), conv_relu_task(12, 7, 24)),
                                  lambda: (matmul_task(64, 48, 32), matmul_task(20, 72, 28))])
def test_a_siblings_programs_fitted_here_compute_the_right_answer(make):
    source, here = make()
    programs = SketchPolicy(source, seed=3).sample(12)
    assert programs
    fitted = [fit_program(p.steps, here.dag) for p in programs]
    assert all(f is not None for f in fitted)
    inputs = here.random_inputs(0)
    [want] = here.reference_outputs(inputs)
    for state in fitted[:6]:
        got = build_kernel(here, state=state)(*inputs)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_job_measures_the_faster_siblings_best_program_first(tmp_path):
    """Task A has records (its best is known), B has none: B's first round measures A's best
    fitted to B's shapes before anything its own search proposes; without sharing it does not."""
    from ansor.schedule.steps import steps_from_json
    from ansor.tuning.job import tune

    a, b = matmul_task(64, 64, 64), matmul_task(32, 96, 48)
    quiet = dict(seed=0, confirm_best=0, pretrained=False, scheduler="round-robin", measures_per_round=4)
    for share in (True, False):
        db = str(tmp_path / f"share{share}.db")
        [first] = [tune(a, TuneOptions(trials=4, **quiet), db)]
        fitted = fit_program(steps_from_json(first.best_steps), b.dag)
        assert fitted is not None
        measured: list[str] = []

        class Seen(TuningCallback):
            def on_result(self, tuner, result):
                if tuner.task is b:
                    measured.append(result.record.state_key)

        tune([b, a], TuneOptions(trials=8, share_programs=share, **quiet), db, [Seen()])  # b first
        assert len(measured) == 4
        assert (measured[0] == fitted.key()) is share


def test_offer_hands_each_program_once_and_only_from_faster_siblings():
    class Tuner:
        def __init__(self, task, cost, steps):
            self.task, self.measured_keys, self.candidates = task, set(), []
            self.result = type("R", (), {"best_cost": cost, "best_steps": steps})()

        @property
        def best_cost(self):  # what the scheduler's view of a tuner reads
            return self.result.best_cost

        @property
        def flop(self):
            return self.task.flop

        def add_candidates(self, states):
            self.candidates += list(states)

    fast_task, slow_task, other = matmul_task(64, 64, 64), matmul_task(32, 96, 48), conv_relu_task(4, 8, 8)
    [program] = SketchPolicy(fast_task, seed=1).sample(1)
    fast = Tuner(fast_task, 1e-6, program.steps_json())
    slow = Tuner(slow_task, 1.0, None)
    unrelated = Tuner(other, 1.0, None)
    siblings = SiblingPrograms([fast, slow, unrelated])
    assert siblings.siblings(0) == [1] and siblings.siblings(2) == []
    assert siblings.offer(1) == 1 and len(slow.candidates) == 1
    assert siblings.offer(1) == 0                       # the same program is not offered twice
    assert siblings.offer(0) == 0                       # the slower sibling has nothing to teach
    assert siblings.offer(2) == 0
    state = slow.candidates[0]
    inputs = slow_task.random_inputs(0)
    np.testing.assert_allclose(build_kernel(slow_task, state=state)(*inputs),
                               slow_task.reference_outputs(inputs)[0], rtol=1e-4, atol=1e-4)
