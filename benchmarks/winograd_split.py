"""Winograd F(4x4, 3x3) as three tuned kernels against the direct convolution.

ResNet's 3x3 stride-1 convolutions run at 95% of this machine's FMA peak (BENCHMARKS.md), and
so do onnxruntime's: the direct form cannot pull ahead. Winograd's minimal filtering does a
third of the multiply-adds. Tuned as one task of five stages it lost to the direct form
(BENCHMARKS.md); this script measures the cut `ansor.te.winograd` declares and the model pass
`ansor.graph.winograd` uses, three tasks that each look like something the search knows:

  1. input transform: V[e*6+nu, p, c] = sum_r1 sum_r2 B^T[e, r1] d[tile p + (r1, r2), c] B^T[nu, r2]
     (two separable reductions of 6 over the padded NHWC input, the first one's result laid out
     tile by tile; p runs over the 4x4 tiles);
  2. the products: M[b] = V[b] @ U[b] for the 36 positions b, with U = G g G^T the weight
     transformed once (a constant, so its layout is rewritten like any weight);
  3. output transform: Y = A^T M A per tile, gathered back to NHWC, plus bias, then ReLU, as
     one stage (a double reduction of 6 x 6 per output): the search did far better with it
     than with two separable stages and a gather (BENCHMARKS.md).

Each task and the direct NHWC conv2d+bias+relu are tuned to the same number of records in one
database (a rerun tops them up); the three kernels are chained on random data and checked
against numpy; then the direct kernel and the chain are timed in turns (medians of several
rounds).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/winograd_split.py \\
        --shapes 56x64 28x128 14x256 --trials 150 --database winograd.db
"""

from __future__ import annotations

import argparse
import statistics
import time
import numpy as np

import ansor
from ansor import te
from ansor.measure import aligned_copy, aligned_empty
from ansor.te import winograd
from ansor.te.ops import batch_matmul, conv2d

TILE = 4
ALPHA = winograd.input_tile(TILE)


def winograd_tasks(size: int, channels: int) -> tuple[ansor.Task, ansor.Task, ansor.Task]:
    """The three tasks of a size x size x channels -> channels convolution (padding 1), the
    stages `ansor.graph.winograd` puts in a model."""
    tiles = int(np.prod(winograd.output_tiles(size, size, TILE)))
    data = te.placeholder((1, size, size, channels), "float32", name="data")
    bt = te.placeholder((ALPHA, ALPHA), "float32", name="bt", constant=True)
    v = winograd.winograd_input(data, bt, (1, 1, 1, 1), TILE, name="v")
    transform_in = ansor.Task([data, bt, v], name="winograd_input")

    v_in = te.placeholder((ALPHA * ALPHA, tiles, channels), "float32", name="v")
    u = te.placeholder((ALPHA * ALPHA, channels, channels), "float32", name="u", constant=True)
    m = batch_matmul(v_in, u, name="m")
    products = ansor.Task([v_in, u, m], name="winograd_products")

    m_in = te.placeholder((ALPHA * ALPHA, tiles, channels), "float32", name="m")
    at = te.placeholder((TILE, ALPHA), "float32", name="at", constant=True)
    bias = te.placeholder((channels,), "float32", name="bias", constant=True)
    y = winograd.winograd_output(m_in, at, (1, size, size), TILE, name="y")
    out = te.compute(y.shape, lambda n, yy, xx, k: te.maximum(y[n, yy, xx, k] + bias[k], 0.0), name="out")
    transform_out = ansor.Task([m_in, at, bias, out], name="winograd_output")
    return transform_in, products, transform_out


def direct_task(size: int, channels: int) -> ansor.Task:
    """The same convolution as ResNet runs it: NHWC, HWIO constant weight, bias, ReLU."""
    data = te.placeholder((1, size, size, channels), "float32", name="data")
    weight = te.placeholder((3, 3, channels, channels), "float32", name="weight", constant=True)
    bias = te.placeholder((channels,), "float32", name="bias", constant=True)
    c = conv2d(data, weight, padding=1, layout="NHWC")
    out = te.compute(c.shape, lambda n, h, w, k: te.maximum(c[n, h, w, k] + bias[k], 0.0), name="out")
    return ansor.Task([data, weight, bias, out], name="conv2d_nhwc_relu")


def median_ms(call, rounds: int = 25) -> float:
    call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run(size: int, channels: int, args) -> None:
    tasks = (direct_task(size, channels), *winograd_tasks(size, channels))
    with ansor.Database(args.database) as db:
        missing = [args.trials - db.count(t.workload_key, t.target.key) for t in tasks]
    for task, trials in zip(tasks, missing):
        if trials > 0:  # a rerun tops each task up to --trials records
            ansor.tune(task, trials=trials, database=args.database, progress=False, seed=args.seed)
    direct, transform_in, products, transform_out = (ansor.build(t, database=args.database) for t in tasks)

    at, _, bt = winograd.winograd_matrices(TILE)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, size, size, channels)).astype(np.float32)
    w = (rng.standard_normal((3, 3, channels, channels)) / np.sqrt(9 * channels)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    u, at32, bt32 = winograd.transform_weight(w, TILE), at.astype(np.float32), bt.astype(np.float32)
    fast = direct.bind(weight=w, bias=b)
    stage_in, stage_mm, stage_out = transform_in.bind(bt=bt32), products.bind(u=u), transform_out.bind(at=at32, bias=b)

    # aligned inputs and outputs allocated once: a fresh 1.8 MB output per call costs page
    # faults, which moved one stage's time several-fold between runs (BENCHMARKS.md)
    x = aligned_copy(x)
    tiles = transform_in.task.outputs[0].shape[1]
    v, m = (aligned_empty((ALPHA * ALPHA, tiles, channels), np.float32) for _ in range(2))
    y, y_direct = (aligned_empty((1, size, size, channels), np.float32) for _ in range(2))

    def chain():
        stage_in(x, out=v)
        stage_mm(v, out=m)
        return stage_out(m, out=y)

    expected = direct(x, w, b)
    reference = np.maximum(sum(np.einsum("nhwc,ck->nhwk", np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
                                         [:, i:i + size, j:j + size], w[i, j]) for i in range(3) for j in range(3)) + b, 0)
    rms = np.sqrt(np.mean(reference ** 2))
    err_direct, err_winograd = (float(np.abs(o - reference).max() / rms) for o in (expected, chain()))
    if err_winograd > 1e-3:
        raise SystemExit(f"{size}x{size}x{channels}: the Winograd chain is off by {err_winograd:.2e} of the RMS")
    rounds = {"direct": [], "winograd": [], "input": [], "products": [], "output": []}
    for _ in range(args.rounds):
        rounds["direct"].append(median_ms(lambda: fast(x, out=y_direct)))
        rounds["winograd"].append(median_ms(chain))
        rounds["input"].append(median_ms(lambda: stage_in(x, out=v)))
        rounds["products"].append(median_ms(lambda: stage_mm(v, out=m)))
        rounds["output"].append(median_ms(lambda: stage_out(m, out=y)))
    med = {k: statistics.median(t) for k, t in rounds.items()}
    print(f"{size}x{size}x{channels} 3x3 (+bias, relu), {args.trials} trials per task; errors of the output RMS: "
          f"direct {err_direct:.1e}, Winograd {err_winograd:.1e}")
    print(f"  direct   {med['direct']:.3f} ms")
    print(f"  Winograd {med['winograd']:.3f} ms = input {med['input']:.3f} + products {med['products']:.3f} "
          f"+ output {med['output']:.3f} (each alone)   direct / Winograd: {med['direct'] / med['winograd']:.2f}x",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["56x64", "28x128"],
                        help="SIZExCHANNELS of each convolution (default: ResNet-18's first two stages)")
    parser.add_argument("--trials", type=int, default=150,
                        help="records per task: tasks with fewer are tuned up to it (0: the database as it is)")
    parser.add_argument("--database", default="winograd.db")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for shape in args.shapes:
        size, channels = map(int, shape.split("x"))
        run(size, channels, args)


if __name__ == "__main__":
    main()
