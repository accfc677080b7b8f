"""ansor.visualize / `ansor viz`: tile levels, pictures, the roofline and the measured peaks.

Every sketch of every named workload gets a sampled program explained and drawn (a valid SVG
read back, and a PNG for the first sketch of each workload), the roofline's numbers agree with each other, the peaks are measured once
(tiny) and cached, and the CLI explains the best record of a tiny tuned matmul. Peaks are fixed
numbers here (never timed), so no assertion depends on the machine's speed.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import xml.etree.ElementTree as ElementTree

import matplotlib.image
import pytest

import ansor
from ansor.cli import main
from ansor.lower.lower import schedule_text
from ansor.store import Database
from ansor.search.annotate_gpu import annotate_program
from ansor.search.sketch_policy import SketchPolicy
from ansor.target import Target
from ansor.viz import MachinePeaks, Roofline, visualize
from ansor.viz import machine as machine_module
from ansor.viz.machine import (CacheLevel, check_peaks, cpu_caches, cpu_model, machine_key, machine_peaks,
                               measure_peaks)
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

    def counted(target):
        measured.append(target)
        return fake_peaks(target)

    monkeypatch.setattr(machine_module, "measure_peaks", counted)
    first = machine_peaks(target, path=path)
    assert len(measured) == 1 and path.exists() and first == fake_peaks(target)
    assert first.key == machine_key(cpu_model(), target.isa, target.num_cores)
    again = machine_peaks(target, path=path)
    assert len(measured) == 1 and again == first  # read back, not measured again
    path.write_text("not json")
    machine_peaks(target, path=path)
    assert len(measured) == 2  # a damaged file is measured over


def test_peak_kernels_run_and_give_rates(tmp_path):
    """A tiny real measurement: every rate is a positive number (how high depends on the load)."""
    peaks = measure_peaks(Target.host(), seconds=0.01, stream_bytes=1 << 20)
    assert set(peaks.peak_gflops) == {"float32", "float64"}
    rates = [*peaks.peak_gflops.values(), peaks.bandwidth_gbs, *(gbs for _, gbs in peaks.cache_bandwidth.values())]
    assert all(math.isfinite(r) and r > 0 for r in rates), peaks


def plausible(target: Target, **changes) -> MachinePeaks:
    """Peaks of a 2-core machine that pass every check, with `changes` applied."""
    fields = {"peak_gflops": {"float32": 300.0, "float64": 150.0}, "bandwidth_gbs": 25.0,
              "cache_bandwidth": {"L2": (4 << 20, 140.0), "L3": (32 << 20, 60.0)}, **changes}
    return MachinePeaks(cpu_model(), target.isa, 2, **fields)


@pytest.mark.parametrize("changes,reason", [
    ({"peak_gflops": {"float32": 0.0, "float64": 150.0}}, "float32 peak 0"),
    ({"peak_gflops": {}}, "no peak"),
    ({"peak_gflops": {"float32": 0.4, "float64": 0.2}}, "below 1"),  # 0.5 GFLOP/s a core at least
    ({"peak_gflops": {"float32": 300.0, "float64": 1.5}}, "disagree"),
    ({"bandwidth_gbs": 0.0}, "memory bandwidth 0"),
    ({"cache_bandwidth": {"L2": (4 << 20, 0.131), "L3": (32 << 20, 60.0)}}, "L2 bandwidth 0.131"),
    ({"cache_bandwidth": {"L2": (4 << 20, 20.0), "L3": (32 << 20, 60.0)}}, "below L3's 60"),
    ({"cache_bandwidth": {"L2": (4 << 20, 140.0), "L3": (32 << 20, 5.0)}}, "below memory's 25"),
    ({"bandwidth_gbs": float("nan")}, "memory bandwidth nan"),
])
def test_implausible_peaks_are_rejected(changes, reason):
    target = Target.host()
    assert check_peaks(plausible(target)) == []
    problems = check_peaks(plausible(target, **changes))
    assert any(reason in p for p in problems), problems


def test_a_peak_below_what_a_kernel_reached_is_rejected():
    peaks = plausible(Target.host())
    assert check_peaks(peaks, {"float32": 299.0}) == []
    assert any("below the 500 a kernel reached" in p for p in check_peaks(peaks, {"float32": 500.0}))
    assert check_peaks(peaks, {"float16": 500.0}) == []  # no peak of that type: nothing to compare


def test_implausible_measurements_are_not_saved(tmp_path, monkeypatch):
    target = Target.host()
    path = tmp_path / "machine.json"
    busy = plausible(target, peak_gflops={"float32": 0.0, "float64": 0.0})
    measured = []
    monkeypatch.setattr(machine_module, "measure_peaks", lambda t: measured.append(t) or busy)
    warned = []
    assert machine_peaks(target, path=path, on_warning=warned.append) is None
    assert len(measured) == 2  # measured again once before giving up
    assert not path.exists()
    assert len(warned) == 1 and "\n" not in warned[0] and "not saved" in warned[0]
    with pytest.warns(RuntimeWarning, match="implausibly"):  # the default warning
        assert machine_peaks(target, path=path) is None


def test_saved_implausible_peaks_are_measured_over(tmp_path, monkeypatch):
    target = Target.host()
    path = tmp_path / "machine.json"
    good = plausible(target)
    monkeypatch.setattr(machine_module, "measure_peaks",
                        lambda t: plausible(t, cache_bandwidth={"L2": (4 << 20, 0.131)}))
    assert machine_peaks(target, path=path, on_warning=lambda m: None) is None
    # a file written before the checks existed: its wrong entry is measured over and replaced
    machine_module._write_peaks(path, {good.key: plausible(target, bandwidth_gbs=0.0).to_dict()})
    monkeypatch.setattr(machine_module, "measure_peaks", lambda t: good)
    warned = []
    assert machine_peaks(target, path=path, on_warning=warned.append) == good
    assert len(warned) == 1 and "implausible" in warned[0]
    assert machine_peaks(target, path=path) == good
    # saved peaks below what this kernel reached are measured again
    faster = plausible(target, peak_gflops={"float32": 900.0, "float64": 450.0})
    monkeypatch.setattr(machine_module, "measure_peaks", lambda t: faster)
    assert machine_peaks(target, path=path, achieved_gflops={"float32": 400.0},
                         on_warning=lambda m: None) == faster


def test_remeasured_peaks_replace_the_saved_ones(tmp_path, monkeypatch):
    target = Target.host()
    path = tmp_path / "machine.json"
    high, low = plausible(target), plausible(target, peak_gflops={"float32": 200.0, "float64": 100.0})
    monkeypatch.setattr(machine_module, "measure_peaks", lambda t: high)
    machine_peaks(target, path=path)
    monkeypatch.setattr(machine_module, "measure_peaks", lambda t: low)
    assert machine_peaks(target, path=path, refresh=True) == high  # refresh keeps the best of both
    assert machine_peaks(target, path=path, refresh=True, replace=True) == low
    assert machine_peaks(target, path=path) == low


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
    from_record = ansor.visualize(record, database=tuned_db)  # the task rebuilt from the database (a path)
    assert from_record.roofline.gflops == pytest.approx(task.flop / record.median_cost / 1e9)
    assert from_record.roofline.fraction is not None and math.isfinite(from_record.roofline.fraction)
    kernel = ansor.build(task, database=tuned_db)
    from_kernel = visualize(kernel, path=str(tmp_path / "k.svg"))
    assert from_kernel.record == kernel.record and from_kernel.text.splitlines()[0] == from_record.text.splitlines()[0]
    check_svg(tmp_path / "k.svg")


def test_cli_viz_remeasure_replaces_the_saved_peaks(tuned_db, monkeypatch, capsys):
    assert main(["viz", "matmul", "--shape", "32,32,32", "--database", tuned_db]) == 0
    assert machine_peaks(Target.host()).bandwidth_gbs == 20.0
    monkeypatch.setattr(machine_module, "measure_peaks", lambda t: MachinePeaks(
        cpu_model(), t.isa, t.num_cores, {"float32": 150.0, "float64": 75.0}, 15.0))
    assert main(["viz", "matmul", "--shape", "32,32,32", "--database", tuned_db]) == 0
    assert machine_peaks(Target.host()).bandwidth_gbs == 20.0  # read back, not measured
    capsys.readouterr()
    assert main(["viz", "matmul", "--shape", "32,32,32", "--database", tuned_db, "--remeasure"]) == 0
    assert "measuring this machine's peak" in capsys.readouterr().err
    assert machine_peaks(Target.host()).bandwidth_gbs == 15.0  # replaced, although lower


def test_a_kernel_above_its_bound_says_the_bound_is_suspect(tmp_path):
    roof = Roofline(flop=1e9, bytes=1e6, peak_gflops=0.01, bandwidth_gbs=0.131, gflops=305.4)
    assert roof.fraction > 1 and roof.suspect and "the bound is suspect" in roof.share_text()
    assert not Roofline(flop=1e9, bytes=1e6, peak_gflops=100.0, bandwidth_gbs=10.0, gflops=50.0).suspect
    task = make_task("matmul", (16, 16, 16))
    kernel = ansor.build(task, database=str(tmp_path / "none.db"), quick_trials=0)  # timed here
    tiny = MachinePeaks(cpu_model(), task.target.isa, task.target.num_cores, {"float32": 1e-6, "float64": 1e-6}, 1e-6)
    view = visualize(kernel, peaks=tiny, path=str(tmp_path / "suspect.svg"))
    assert view.roofline.suspect
    shares = [line for line in view.text.splitlines() if "of its bound" in line]
    assert shares and all("suspect" in line for line in shares), shares
    assert "--remeasure" in view.text
    assert "the bound is suspect" in (tmp_path / "suspect.svg").read_text()


def test_cli_viz_without_a_record_says_to_tune(tmp_path, capsys):
    db = str(tmp_path / "empty.db")
    Database(db).close()
    assert main(["viz", "matmul", "--shape", "8,8,8", "--database", db]) == 2  # 1 is for wrong results
    err = capsys.readouterr().err
    assert "no record of matmul" in err and "ansor tune matmul --shape 8,8,8" in err
    assert main(["viz", "matmul", "--shape", "8,8,8", "--database", db, "-o", "x.jpg"]) == 2


# --- the loop nest a view prints (kernel.schedule, `ansor sample`, `ansor sketches`) ------------

LOOP_LINE = re.compile(r"^(\s*)(?:for|parallel|vectorize|unroll|bind\([\w.]+\)) (\S+) in range\((\d+|\?)")
NAME = re.compile(r"(?<![\w.@])[A-Za-z_][\w.@]*")


def _binding(line: str) -> list[tuple[str, str]] | None:
    """`i = i.0 * 32 + i.1; k = k.0` as (name, value) pairs; None for any other line."""
    parts = [part.split(" = ", 1) for part in line.strip().split("; ")]
    if all(len(p) == 2 and re.fullmatch(r"[\w.@]+", p[0]) for p in parts):
        return [(p[0], p[1]) for p in parts]
    return None


def _index_names(statement: str) -> list[str]:
    """Variables used inside the brackets of a statement (tensor and function names left out)."""
    out = []
    for m in NAME.finditer(statement):
        depth = statement[:m.start()].count("[") - statement[:m.start()].count("]")
        if depth > 0 and statement[m.end():m.end() + 1] not in ("[", "("):
            out.append(m.group())
    return out


def nest_statements(text: str):
    """Each statement of a printed nest with the loops around it ((name, extent) outer first)
    and the bindings printed right above it."""
    loops: list[tuple[int, str, str]] = []
    bindings: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("placeholder:") or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        while loops and loops[-1][0] >= indent:
            loops.pop()
        m = LOOP_LINE.match(line)
        if m:
            loops.append((indent, m.group(2), m.group(3)))
            bindings = []
        elif _binding(line) is not None:
            bindings = _binding(line)
        else:
            yield [(name, extent) for _, name, extent in loops], bindings, line.strip()
            bindings = []


def unbound_variables(text: str) -> list[str]:
    """Variables a statement's indices (or a binding above it) use that no enclosing printed
    loop binds and no binding names."""
    problems = []
    for loops, bindings, statement in nest_statements(text):
        bound = {name for name, _ in loops}
        for name, value in bindings:
            problems += [f"{v} (in {name} = {value})" for v in NAME.findall(value) if v not in bound]
        bound |= {name for name, _ in bindings}
        problems += [f"{v} (in {statement})" for v in _index_names(statement) if v not in bound]
    return problems


def test_the_nest_checker_finds_an_unbound_variable():
    assert unbound_variables("for i.0 in range(4):\n  for i.1 in range(8):\n    C[i] = A[i]") == \
        ["i (in C[i] = A[i])", "i (in C[i] = A[i])"]
    assert unbound_variables("for i.0 in range(4):\n  i = i.0 * 8 + i.1\n  C[i] = A[i]") == ["i.1 (in i = i.0 * 8 + i.1)"]
    assert unbound_variables("for i.0 in range(4):\n  for i.1 in range(8):\n    i = i.0 * 8 + i.1\n"
                             "    C[i] = exp(A[i])") == []


def _written_indices(statement: str) -> list[str]:
    """The index expressions of the element a statement writes (`C[i, j * 2] = ...`)."""
    depth, parts, current = 0, [], ""
    for ch in statement[statement.index("[") + 1:]:
        if depth == 0 and ch in ",]":
            parts.append(current.strip())
            if ch == "]":
                return parts
            current = ""
            continue
        depth += {"[": 1, "(": 1, "]": -1, ")": -1}.get(ch, 0)
        current += ch
    raise ValueError(statement)


def visited_points(state, text: str):
    """Per statement: its stage's op, and the (spatial..., reduce...) point of every iteration,
    evaluating the printed nest: the indices it writes, and its reduction axes from the loops
    and bindings (points out of the domain are the ones guards skip)."""
    for loops, bindings, statement in nest_statements(text):
        op = state.stages[state.stage_id(statement.split("[", 1)[0])].op
        safe = {name: f"v{k}" for k, (name, _) in enumerate(loops)}
        safe.update({name: f"b{k}" for k, (name, _) in enumerate(bindings)})
        used = set(NAME.findall(statement))
        if not all(a.name in safe and a.name in used for a in op.reduce_axes):
            continue  # a reduction axis written into the statement (named like a loop around it)

        def compiled(expr: str):
            return compile(NAME.sub(lambda m: safe[m.group()], expr), "<printed>", "eval")

        code = [(safe[name], compiled(value)) for name, value in bindings]
        point = [compiled(i) for i in _written_indices(statement)] + [compiled(a.name) for a in op.reduce_axes]
        points = []
        for values in itertools.product(*(range(int(extent)) for _, extent in loops)):
            env = {safe[name]: v for (name, _), v in zip(loops, values)}
            for name, expr in code:
                env[name] = eval(expr, {}, env)  # noqa: S307 - index arithmetic the printer wrote
            points.append(tuple(eval(c, {}, env) for c in point))  # noqa: S307
        yield op, points


NEST_CASES = {"matmul": ((16, 16, 16), {}), "conv2d": ((1, 4, 8, 8, 8, 3, 3), {"padding": 1}),
              "softmax": ((8, 32), {})}


@pytest.mark.parametrize("name", sorted(NEST_CASES))
def test_printed_nests_bind_every_variable_they_use(name):
    shape, opts = NEST_CASES[name]
    task = make_task(name, shape, **opts)
    policy = SketchPolicy(task, seed=3)
    for sketch in policy.sketches:  # `ansor sketches`: undecided lengths, values read off the steps
        assert unbound_variables(str(sketch.state)) == [], str(sketch.state)
    output = task.outputs[0].name
    for state in policy.sample(6):
        for text in (schedule_text(state), str(state)):  # kernel.schedule / `ansor sample`; str(state)
            assert unbound_variables(text) == [], text
        # the bindings are the values the program computes with: each statement visits every
        # point of its domain, and the output's statement each point once
        checked = []
        for op, points in visited_points(state, schedule_text(state)):
            axes = [*op.axes, *op.reduce_axes]
            domain = sorted(itertools.product(*(range(a.extent) for a in axes)))
            inside = sorted(p for p in points if all(0 <= v < a.extent for v, a in zip(p, axes)))
            assert sorted(set(inside)) == domain, schedule_text(state)
            if op.name == output:
                assert inside == domain, schedule_text(state)
            checked.append(op.name)
        assert output in checked
