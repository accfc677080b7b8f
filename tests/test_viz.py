"""ansor.visualize / `ansor viz`: tile levels, pictures, the roofline and the measured peaks.

Every sketch of every named workload gets a sampled program explained and drawn (a valid SVG
read back, and a PNG for the first sketch of each workload), the roofline's numbers agree with each other, the peaks are measured once
(tiny) and cached, and the CLI explains the best record of a tiny tuned matmul. Peaks are fixed
numbers here (never timed), so no assertion depends on the machine's speed.
"""

from __future__ import annotations

import math
import random
import xml.etree.ElementTree as ElementTree

import matplotlib.image
import pytest

import ansor
from ansor.cli import main
from ansor.store import Database
from ansor.search.annotate_gpu import annotate_program
from ansor.search.sketch_policy import SketchPolicy
from ansor.target import Target
from ansor.viz import MachinePeaks, Roofline, visualize
from ansor.viz import machine as machine_module
from ansor.viz.machine import CacheLevel, cpu_caches, cpu_model, machine_key, machine_peaks, measure_peaks
from ansor.workloads import WORKLOADS, make_task

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

SMALL = {
    "matmul": ((32, 32, 32), {}),
    "batch_matmul": ((2, 16, 16, 16), {}),
    "matmul_bias_relu": ((32, 32, 32), {}),
    "dense": ((16, 32, 32), {}),
    "conv2d": ((1, 4, 8, 8, 8, 3, 3), {"padding": 1}),
    "conv2d_bias_relu": ((1, 4, 8, 8, 8, 3, 3), {"padding": 1}),
    "depthwise_conv2d": ((1, 8, 8, 8, 3, 3), {"padding": 1}),
    "conv2d_transpose": ((1, 8, 4, 4, 8, 4, 4), {}),
    "max_pool2d": ((1, 4, 8, 8, 3), {}),
    "avg_pool2d": ((1, 4, 8, 8, 2), {}),
    "relu": ((16, 16), {}),
    "gelu": ((16, 16), {}),
    "softmax": ((8, 32), {}),
    "layer_norm": ((8, 32), {}),
    "layer_norm_gelu": ((8, 32), {}),
    "norm2": ((16, 16), {}),
}


def fake_peaks(target: Target) -> MachinePeaks:
    return MachinePeaks(cpu_model(), target.isa, target.num_cores, {"float32": 200.0, "float64": 100.0}, 20.0)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "default.db"))


def sampled_programs(task: ansor.Task):
    """One complete program per sketch (a few annotation tries each)."""
    policy = SketchPolicy(task, seed=0)
    for i, sketch in enumerate(policy.sketches):
        rng = random.Random(i)
        state = None
        for _ in range(20):
            state = annotate_program(sketch.steps, task.dag, rng, policy.params, policy.hardware)
            if state is not None:
                break
        assert state is not None, f"{task.name}: sketch {i} could not be annotated"
        yield i, state


def check_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    image = matplotlib.image.imread(str(path))
    assert image.shape[0] > 100 and image.shape[1] > 100


def check_svg(path) -> None:
    root = ElementTree.parse(str(path)).getroot()
    assert root.tag.endswith("svg") and len(path.read_bytes()) > 1000


def check_roofline(roof: Roofline) -> None:
    assert roof.bytes > 0
    assert roof.intensity == pytest.approx(roof.flop / roof.bytes)
    assert roof.bound_gflops == pytest.approx(min(roof.peak_gflops, roof.intensity * roof.bandwidth_gbs))
    assert roof.bound == ("compute" if roof.peak_gflops <= roof.intensity * roof.bandwidth_gbs else "memory")


def test_small_shapes_cover_every_workload():
    assert set(SMALL) == set(WORKLOADS)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_sketch_is_explained_and_drawn(name, tmp_path):
    shape, opts = SMALL[name]
    task = make_task(name, shape, **opts)
    peaks = fake_peaks(task.target)
    for i, state in sampled_programs(task):
        view = visualize((task, state), peaks=peaks)
        assert view.nest is not None, f"sketch {i}: {view.notes}"
        levels = view.nest.levels
        assert levels[0].loops == () and levels[0].iterations == 1
        assert levels[0].tile == view.nest.shapes[view.nest.output]  # level 0: the whole tensor
        for outer, inner in zip(levels, levels[1:]):
            assert inner.iterations >= outer.iterations
            if inner.tensor == outer.tensor:
                assert all(a <= b for a, b in zip(inner.tile, outer.tile)), (i, outer.tile, inner.tile)
        check_roofline(view.roofline)
        text = view.text
        for words in ("tile levels", "arithmetic intensity", "bound", "whole program"):
            assert words in text, (i, words)
        # every sketch as SVG; the first also as PNG (Agg's rendering costs half a second a picture)
        for suffix in ((".svg", ".png") if i == 0 else (".svg",)):
            path = tmp_path / f"{name}-{i}{suffix}"
            view.save(str(path))
            check_png(path) if suffix == ".png" else check_svg(path)


def test_gpu_programs_are_drawn_without_roofs(tmp_path):
    task = make_task("conv2d_bias_relu", (1, 4, 8, 8, 8, 3, 3), target=Target.cuda(), padding=1)
    for i, state in sampled_programs(task):
        view = visualize((task, state), path=str(tmp_path / f"gpu{i}.png"))
        assert view.nest is not None and view.roofline.bound is None
        assert any(lp.kind.startswith(("blockIdx", "threadIdx")) for lv in view.nest.levels for lp in lv.loops)
        assert "no roofs" in view.text and [c.name for c in view.caches] == ["shared"]
        check_png(tmp_path / f"gpu{i}.png")


def test_fused_matmul_tiles_are_drawn_in_the_output():
    task = make_task("matmul_bias_relu", (32, 32, 32))
    fused = [visualize((task, s), roofline=False) for _, s in sampled_programs(task)]
    fused = [v for v in fused if v.fused]
    assert fused, "a matmul+ReLU sketch computes the matmul at the ReLU's loops"
    for view in fused:
        assert view.nest.main_buffer == "matmul" and view.nest.output == "relu"
        assert all(level.tensor == "relu" for level in view.nest.levels)
        assert "matmul at relu." in view.text


def test_roofline_bounds():
    memory = Roofline(flop=1e9, bytes=1e9, peak_gflops=100.0, bandwidth_gbs=10.0, gflops=5.0)
    assert memory.intensity == 1.0 and memory.ridge == 10.0
    assert memory.bound == "memory" and memory.bound_gflops == 10.0 and memory.fraction == pytest.approx(0.5)
    compute = Roofline(flop=1e9, bytes=1e6, peak_gflops=100.0, bandwidth_gbs=10.0, gflops=50.0)
    assert compute.bound == "compute" and compute.bound_gflops == 100.0 and compute.fraction == pytest.approx(0.5)
    unknown = Roofline(flop=1e9, bytes=1e6, peak_gflops=None, bandwidth_gbs=None)
    assert unknown.bound is None and unknown.fraction is None and unknown.bound_gflops is None


def test_traffic_shrinks_with_larger_caches():
    task = make_task("matmul", (64, 64, 64))
    for _, state in sampled_programs(task):
        view = visualize((task, state), roofline=False)
        nest = view.nest
        sizes = [1 << 10, 1 << 14, 1 << 18, 1 << 30]
        traffic = [nest.traffic(size, 1, 2) for size in sizes]
        assert traffic[-1] == nest.total_bytes  # everything fits: the data moves once
        assert all(a >= b for a, b in zip(traffic, traffic[1:])), traffic
        assert view.traffic["memory"] == view.traffic[view.caches[-1].name]


def test_peaks_are_measured_once_and_cached(tmp_path, monkeypatch):
    target = Target.host()
    path = tmp_path / "machine.json"
    measured = []

    def tiny(target):
        measured.append(target)
        return measure_peaks(target, seconds=0.01, stream_bytes=1 << 20)

    monkeypatch.setattr(machine_module, "measure_peaks", tiny)
    first = machine_peaks(target, path=path)
    assert len(measured) == 1 and path.exists()
    assert first.peak_gflops["float32"] > 0 and first.peak_gflops["float64"] > 0 and first.bandwidth_gbs > 0
    assert first.key == machine_key(cpu_model(), target.isa, target.num_cores)
    again = machine_peaks(target, path=path)
    assert len(measured) == 1 and again == first  # read back, not measured again
    path.write_text("not json")
    machine_peaks(target, path=path)
    assert len(measured) == 2  # a damaged file is measured over


def test_cache_sizes_are_read_or_assumed(tmp_path, monkeypatch):
    caches = cpu_caches()
    assert [c.name for c in caches] == sorted(c.name for c in caches) and caches
    assert all(c.size > 0 and c.shared_by >= 1 for c in caches)
    index = tmp_path / "index0"
    index.mkdir()
    for name, value in (("type", "Data"), ("level", "1"), ("size", "48K"), ("shared_cpu_list", "0-1")):
        (index / name).write_text(value + "\n")
    assert machine_module._sysfs_caches(str(tmp_path)) == {1: (48 * 1024, 2)}

    class Lscpu:
        stdout = "L1d cache: 96 KiB (2 instances)\nL2 cache: 4 MiB (2 instances)\nL3 cache: 260 MiB (1 instance)\n"

    monkeypatch.setattr(machine_module.subprocess, "run", lambda *a, **k: Lscpu())
    assert machine_module._lscpu_caches(2) == {1: (48 * 1024, 1), 2: (2 << 20, 1), 3: (260 << 20, 2)}
    monkeypatch.setattr(machine_module, "_sysfs_caches", lambda: {})
    monkeypatch.setattr(machine_module, "_lscpu_caches", lambda cores: {})
    assert [c.name for c in cpu_caches(2)] == ["L1", "L2", "L3"]  # typical sizes where nothing tells
    assert CacheLevel("L3", 8 << 20, 2) in cpu_caches(2)


def test_inputs_visualize_takes(tmp_path):
    task = make_task("matmul", (16, 16, 16))
    _, state = next(iter(sampled_programs(task)))
    with pytest.raises(TypeError, match="needs the task"):
        visualize(state)
    assert visualize(state, task=task, roofline=False).roofline.bound is None
    with pytest.raises(ValueError, match=".png or .svg"):
        visualize((task, state), path=str(tmp_path / "x.jpg"), roofline=False)
    with pytest.raises(TypeError, match="Kernel, a Record"):
        visualize(42)
    untuned = ansor.build(task, database=str(tmp_path / "none.db"), quick_trials=0)  # no record: timed here
    view = visualize(untuned, roofline=False)
    assert view.record is None and view.seconds is not None and "timed here" in view.text


@pytest.fixture
def tuned_db(tmp_path, monkeypatch):
    """A tiny tuned matmul (4 trials) and fixed peaks in place of a measurement."""
    monkeypatch.setattr(machine_module, "measure_peaks", fake_peaks)
    db = str(tmp_path / "viz.db")
    assert main(["tune", "matmul", "--shape", "32,32,32", "--trials", "4", "--database", db, "--quiet",
                 "--no-baseline", "--seed", "0"]) == 0
    return db


def test_cli_viz_and_the_python_inputs(tuned_db, tmp_path, capsys):
    capsys.readouterr()
    out_png = tmp_path / "out.png"
    assert main(["viz", "matmul", "--shape", "32,32,32", "--database", tuned_db, "-o", str(out_png)]) == 0
    text = capsys.readouterr().out
    check_png(out_png)
    for words in ("GFLOP/s", "arithmetic intensity", "of its bound", "tile levels", "L1"):
        assert words in text, words
    assert machine_peaks(Target.host()).bandwidth_gbs == 20.0  # the peaks file written by that run

    task = make_task("matmul", (32, 32, 32))
    with Database(tuned_db, create=False) as db:
        record = db.best(task.workload_key, task.target.key)[0]
    from_record = visualize(record, database=tuned_db)  # the task rebuilt from the database
    assert from_record.roofline.gflops == pytest.approx(task.flop / record.median_cost / 1e9)
    assert from_record.roofline.fraction is not None and math.isfinite(from_record.roofline.fraction)
    kernel = ansor.build(task, database=tuned_db)
    from_kernel = visualize(kernel, path=str(tmp_path / "k.svg"))
    assert from_kernel.record == kernel.record and from_kernel.text.splitlines()[0] == from_record.text.splitlines()[0]
    check_svg(tmp_path / "k.svg")


def test_cli_viz_without_a_record_says_to_tune(tmp_path, capsys):
    db = str(tmp_path / "empty.db")
    Database(db).close()
    assert main(["viz", "matmul", "--shape", "8,8,8", "--database", db]) == 1
    err = capsys.readouterr().err
    assert "no record of matmul" in err and "ansor tune matmul --shape 8,8,8" in err
    assert main(["viz", "matmul", "--shape", "8,8,8", "--database", db, "-o", "x.jpg"]) == 2
