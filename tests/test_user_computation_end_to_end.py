"""A computation ansor has never seen, declared in a script and tuned there, is served from the
database alone afterwards: `ansor show --schedule` prints its loop nest, the cost model
evaluates on it, export/import carries it, and `ansor.build` in a third process, with the same
declaration, returns the tuned program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

DECLARATION = '''
import ansor
from ansor import te

N = 16

def declare():
    """relu(A @ B + bias) and its row maxima: a fused computation no named workload has."""
    A = te.placeholder((N, N), "float32", name="A")
    B = te.placeholder((N, N), "float32", name="B")
    bias = te.placeholder((N,), "float32", name="bias")
    k = te.reduce_axis(N, name="k")
    mm = te.compute((N, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="mm")
    act = te.compute((N, N), lambda i, j: te.maximum(mm[i, j] + bias[j], 0.0), name="act")
    r = te.reduce_axis(N, name="r")
    rowmax = te.compute((N,), lambda i: te.max(act[i, r], axis=r), name="rowmax")
    return ansor.Task([A, B, bias, act, rowmax])
'''

TUNE = '''
import ansor
from declaration import declare

result = ansor.tune(declare(), trials=12, database="tuned.db", seed=0, progress=False)
assert result.trials == 12, result.trials
'''

BUILD = '''
import json
import numpy as np
import ansor
from ansor.store import Database
from declaration import declare

task = declare()
kernel = ansor.build(task, database="fresh.db")
with Database("fresh.db", create=False) as db:
    best = db.best(task.workload_key, task.target.key)[0]
rng = np.random.default_rng(0)
a, b, bias = (rng.standard_normal(t.shape).astype("float32") for t in task.inputs)
act, rowmax = kernel(a, b, bias)
expected = np.maximum(a.astype(np.float64) @ b + bias, 0)
np.testing.assert_allclose(act, expected, rtol=1e-4, atol=1e-5)
np.testing.assert_allclose(rowmax, expected.max(axis=1), rtol=1e-4, atol=1e-5)
print(json.dumps({"kernel_steps": kernel.record.steps if kernel.record else None, "best_steps": best.steps}))
'''


def _run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{args} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out


def test_a_user_computation_is_served_from_the_database_alone(tmp_path: Path):
    (tmp_path / "declaration.py").write_text(textwrap.dedent(DECLARATION))
    (tmp_path / "tune.py").write_text(TUNE)
    (tmp_path / "build.py").write_text(BUILD)
    env = dict(os.environ, ANSOR_CACHE_DIR=str(tmp_path / "cache"), ANSOR_DB=str(tmp_path / "default.db"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    cli = [sys.executable, "-m", "ansor.cli"]

    _run([sys.executable, "tune.py"], tmp_path, env)

    # a second process with only the database: the declaration is nowhere on its path
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    alone = dict(env, PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    tuned, jsonl, fresh = (str(tmp_path / name) for name in ("tuned.db", "records.jsonl", "fresh.db"))
    show = _run(cli + ["show", "--database", tuned, "--schedule", "--workload", "rowmax"], elsewhere, alone)
    assert "act 16x16, rowmax 16" in " ".join(show.stdout.split())
    lines = show.stdout.splitlines()
    assert any(line.lstrip().startswith("for ") for line in lines), show.stdout
    assert "no loop nest" not in show.stdout and '["SP"' not in show.stdout
    evaluation = _run(cli + ["costmodel", "eval", "--database", tuned], elsewhere, alone)
    said = " ".join(evaluation.stdout.split())  # the console wraps long lines
    assert "12 programs of 1 workloads" in said and "(0 records could not be replayed)" in said
    _run(cli + ["export", jsonl, "--database", tuned], elsewhere, alone)
    _run(cli + ["import", jsonl, "--database", fresh], elsewhere, alone)
    assert not (tmp_path / "default.db").exists()

    built = _run([sys.executable, "build.py"], tmp_path, env)
    steps = json.loads(built.stdout.strip().splitlines()[-1])
    assert steps["kernel_steps"] is not None and steps["kernel_steps"] == steps["best_steps"]
