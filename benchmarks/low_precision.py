"""int8 and bfloat16 GEMMs tuned by ansor (dot-product instructions where the CPU has them)
beside ansor's float32 GEMM and the fastest int8 / bf16 GEMM of PyTorch and onnxruntime.

    python benchmarks/low_precision.py [--size 1024] [--trials 64] [--database low_precision.db]

Each GEMM is tuned into the database (resumable), its best kernel built and checked against
numpy (int8 bit-exact, bf16 within bf16 rounding of the float32-accumulated product), then
every side is timed in turns (medians of rounds) and the ratios printed. The weights are bound
once (packed into the instruction's layout), as a model's are.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np
from common import TIMING_ROUNDS, TURN_PAUSE_S, git_commit, machine_name

import ansor
from ansor import te
from ansor.baselines import paired_ratio, time_in_turns


def gemm_task(n: int, a_dtype: str, b_dtype: str, acc: str) -> ansor.Task:
    a = te.placeholder((n, n), a_dtype, name="A")
    b = te.placeholder((n, n), b_dtype, name="B", constant=True)
    k = te.reduce_axis(n, name="k")
    c = te.compute((n, n), lambda i, j: te.sum(te.cast(a[i, k], acc) * te.cast(b[k, j], acc), axis=k)
                   if a_dtype != acc else te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return ansor.Task([a, b, c])


def tuned(task: ansor.Task, trials: int, database: str, label: str):
    ansor.tune(task, trials=trials, database=database, progress=False)
    return ansor.build(task, database=database)


def torch_sides(a8: np.ndarray, b8: np.ndarray, abf: np.ndarray, bbf: np.ndarray) -> dict:
    """PyTorch's int8 GEMM (torch._int_mm, where it runs on the CPU) and bf16 matmul."""
    try:
        import torch
    except ImportError:
        return {}
    sides = {}
    # _int_mm multiplies int8 by int8: the uint8 activations shifted by -128 (the same work)
    ta = torch.from_numpy((a8.astype(np.int16) - 128).astype(np.int8))
    tb = torch.from_numpy(b8)
    try:
        torch._int_mm(ta, tb)
        sides["torch _int_mm s8"] = lambda: torch._int_mm(ta, tb)
    except (RuntimeError, AttributeError):
        pass
    ta16 = torch.from_numpy(abf.view(np.int16)).view(torch.bfloat16)  # the same bits
    tb16 = torch.from_numpy(bbf.view(np.int16)).view(torch.bfloat16)
    sides["torch matmul bf16"] = lambda: torch.matmul(ta16, tb16)
    return sides


def onnxruntime_side(a8: np.ndarray, b8: np.ndarray) -> dict:
    """onnxruntime's MatMulInteger (u8 x s8 -> s32) with the weight as an initializer."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return {}
    n = a8.shape[0]
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["C"])], "mmi",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [n, n])],
        [helper.make_tensor_value_info("C", TensorProto.INT32, [n, n])],
        [numpy_helper.from_array(b8, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    options = ort.SessionOptions()
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    if not np.array_equal(session.run(None, {"A": a8})[0], a8.astype(np.int32) @ b8.astype(np.int32)):
        raise AssertionError("onnxruntime MatMulInteger disagrees with numpy")
    _ = onnx
    return {"onnxruntime MatMulInteger u8s8": lambda: session.run(None, {"A": a8})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--database", default="low_precision.db")
    parser.add_argument("--rounds", type=int, default=TIMING_ROUNDS)
    args = parser.parse_args()
    n = args.size
    target = ansor.Target.host()
    print(f"# {machine_name()}; target {target.key}, dot products {', '.join(target.dot_products) or 'none'}; "
          f"commit {git_commit()}; {args.trials} trials each; {args.rounds} rounds in turns")
    rng = np.random.default_rng(0)
    a8 = rng.integers(0, 256, (n, n), dtype=np.uint8)
    b8 = rng.integers(-128, 128, (n, n), dtype=np.int8)
    a32 = rng.standard_normal((n, n)).astype(np.float32)
    b32 = rng.standard_normal((n, n)).astype(np.float32)
    abf, bbf = a32.astype(ml_dtypes.bfloat16), b32.astype(ml_dtypes.bfloat16)

    int8 = tuned(gemm_task(n, "uint8", "int8", "int32"), args.trials, args.database, "int8")
    bf16 = tuned(gemm_task(n, "bfloat16", "bfloat16", "float32"), args.trials, args.database, "bf16")
    f32 = tuned(gemm_task(n, "float32", "float32", "float32"), args.trials, args.database, "float32")
    print("# int8 kernel uses vpdpbusd:", "dpbusd" in int8.source, "| bf16 kernel uses vdpbf16ps:",
          "dpbf16" in bf16.source)

    run8, runbf, run32 = int8.bind(B=b8), bf16.bind(B=bbf), f32.bind(B=b32)
    if not np.array_equal(run8(a8), a8.astype(np.int32) @ b8.astype(np.int32)):
        raise AssertionError("ansor int8 GEMM is not bit-exact")
    want = abf.astype(np.float64) @ bbf.astype(np.float64)
    bound = 2.0 ** -8 * (np.abs(abf.astype(np.float32)) @ np.abs(bbf.astype(np.float32)))
    if not np.all(np.abs(runbf(abf) - want) <= bound):
        raise AssertionError("ansor bf16 GEMM is outside one bf16 rounding")

    sides = {"ansor int8 u8s8->s32": lambda: run8(a8), "ansor bf16->f32": lambda: runbf(abf),
             "ansor float32": lambda: run32(a32)}
    sides.update(torch_sides(a8, b8, abf, bbf))
    sides.update(onnxruntime_side(a8, b8))
    timings = time_in_turns(sides, rounds=args.rounds, pause_s=TURN_PAUSE_S)
    flop = 2.0 * n ** 3
    for name, t in timings.items():
        print(f"{name:34s} {t.median * 1e3:9.3f} ms  {flop / t.median / 1e9:8.1f} G(FL)OP/s  spread {t.spread:.2f}")
    base8, basebf, base32 = timings["ansor int8 u8s8->s32"], timings["ansor bf16->f32"], timings["ansor float32"]
    print(f"int8 vs ansor float32:        {paired_ratio(base32, base8):.2f}x (bar 2.5x)")
    print(f"bf16 vs ansor float32:        {paired_ratio(base32, basebf):.2f}x (bar 1.5x)")
    for name in ("torch _int_mm s8", "onnxruntime MatMulInteger u8s8"):
        if name in timings:
            print(f"int8 vs {name}: {paired_ratio(timings[name], base8):.2f}x (bar 1.0x vs the fastest)")
    if "torch matmul bf16" in timings:
        print(f"bf16 vs torch matmul bf16:    {paired_ratio(timings['torch matmul bf16'], basebf):.2f}x (bar 1.0x)")


if __name__ == "__main__":
    main()
