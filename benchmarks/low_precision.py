"""int8 and bfloat16 GEMMs tuned by ansor (dot-product instructions where the CPU has them)
beside ansor's float32 GEMM and the fastest int8 / bf16 GEMM of PyTorch and onnxruntime.

    python benchmarks/low_precision.py [--size 1024] [--trials 64] [--database low_precision.db]
    python benchmarks/low_precision.py --model resnet18 [--activations uint8|int8] [--trials 8]

Each GEMM is tuned into the database (resumable), its best kernel built and checked against
numpy (int8 bit-exact, bf16 within bf16 rounding of the float32-accumulated product), then
every side is timed in turns (medians of rounds) and the ratios printed. The weights are bound
once (packed into the instruction's layout), as a model's are.

`--model resnet18` times the quantized ResNet-18 instead: the float model (random weights,
`ansor.pretrain.models`) quantized by `onnxruntime.quantization.quantize_static` (QDQ,
per-channel int8 weights, uint8 or int8 activations, calibrated on random images), imported
by `from_onnx`, tuned with `--trials` per task (0: the quick build alone) and built; beside it
onnxruntime running the same quantized model, and ansor's and onnxruntime's float32 ResNet-18
(ansor's tuned with the same trials per task, or `--float32-trials`). Top-1 classes of ansor's int8 model are checked
against onnxruntime's on `--check-inputs` random images; the four are timed in turns, with
`uptime` before and after (the ratios are paired per round: a loaded phase falls on both).
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


def _uptime() -> str:
    try:
        with open("/proc/loadavg") as f:
            return "load average " + " ".join(f.read().split()[:3])
    except OSError:
        return "load average unknown"


def _quantized_onnx(module, inputs, activations: str, folder: str) -> tuple[str, str]:
    """(float ONNX path, quantize_static's QDQ model of it)."""
    import os

    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    float_path = os.path.join(folder, "float.onnx")
    torch.onnx.export(module, inputs, float_path, input_names=["x"], output_names=["y"], opset_version=17,
                      dynamo=False)

    class RandomImages(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": np.random.RandomState(i).randn(*inputs[0].shape).astype(np.float32)}
                                 for i in range(8)])

        def get_next(self):
            return next(self.batches, None)

    path = os.path.join(folder, f"qdq_{activations}.onnx")
    quantize_static(float_path, path, RandomImages(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    return float_path, path


def _tuned_model(graph, trials_per_task: int, database: str, label: str):
    import time

    from ansor.graph.model_tasks import extract_tasks
    from ansor.graph.model_tuning import tune_model
    from ansor.store import open_store

    tasks = extract_tasks(graph)
    start = time.time()
    if trials_per_task > 0:
        with open_store(database)[0] as store:
            tune_model(tasks, store, trials_per_task * len(tasks.tasks), seed=0)
    compiled = ansor.build(graph, database=database)
    print(f"# {label}: {len(tasks.tasks)} tasks, tuned {trials_per_task} trials per task and built in "
          f"{time.time() - start:.0f} s; {compiled.summary().splitlines()[0]}", flush=True)
    return tasks, compiled


def quantized_model(args) -> None:
    """The `--model resnet18` comparison (module docstring)."""
    import os
    import tempfile

    import onnxruntime as ort

    from ansor.graph.onnx_importer import from_onnx
    from ansor.pretrain.models import make_model

    target = ansor.Target.host()
    print(f"# {machine_name()}; target {target.key}, dot products {', '.join(target.dot_products) or 'none'}; "
          f"commit {git_commit()}; {args.model} QDQ {args.activations}; {args.trials} trials per task; "
          f"{args.rounds} rounds in turns; {_uptime()}", flush=True)
    module, inputs = make_model(args.model)
    module = module.eval()
    folder = tempfile.mkdtemp(prefix="quantized_model_")
    float_path, path = _quantized_onnx(module, inputs, args.activations, folder)
    tasks8, int8 = _tuned_model(from_onnx(path), args.trials, args.database, f"ansor int8 {args.model}")
    f32_trials = args.trials if args.float32_trials is None else args.float32_trials
    _, f32 = _tuned_model(ansor.graph.from_torch(module, inputs), f32_trials, args.database,
                          f"ansor float32 {args.model}")
    integer = [k for key, k in int8.kernels.items() if "conv2d_integer" in k.task.name or "matmul_integer" in k.task.name]
    print(f"# integer layers: {len(integer)} kernels, {sum('dpbusd' in k.source for k in integer)} with vpdpbusd",
          flush=True)

    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    session8 = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    session32 = ort.InferenceSession(float_path, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    differ = 0
    for _ in range(args.check_inputs):
        x = rng.standard_normal(inputs[0].shape).astype(np.float32)
        ours, theirs = np.asarray(int8(x)), session8.run(None, {"x": x})[0]
        differ += int(ours.argmax() != theirs.argmax())
    print(f"top-1 of ansor int8 equal to onnxruntime int8 on {args.check_inputs - differ} of {args.check_inputs} "
          f"random inputs", flush=True)

    x = inputs[0].numpy()
    sides = {"ansor int8": lambda: int8(x), "onnxruntime int8": lambda: session8.run(None, {"x": x}),
             "ansor float32": lambda: f32(x), "onnxruntime float32": lambda: session32.run(None, {"x": x})}
    timings = time_in_turns(sides, rounds=args.rounds, min_repeat_s=0.3, pause_s=0.5)
    base = timings["ansor int8"]
    for name, t in timings.items():
        print(f"{name:22s} {t.median * 1e3:9.3f} ms  spread {t.spread:.2f}  paired ratio to ansor int8 "
              f"{paired_ratio(t, base):.2f}")
    print(f"ansor int8 vs onnxruntime int8: {paired_ratio(timings['onnxruntime int8'], base):.2f}x (bar 1.0x); "
          f"vs ansor float32: {paired_ratio(timings['ansor float32'], base):.2f}x (bar 1.8x); {_uptime()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--database", default="low_precision.db")
    parser.add_argument("--rounds", type=int, default=TIMING_ROUNDS)
    parser.add_argument("--model", choices=("resnet18",), default=None,
                        help="time this model quantized by onnxruntime instead of the GEMMs")
    parser.add_argument("--activations", choices=("uint8", "int8"), default="uint8")
    parser.add_argument("--check-inputs", type=int, default=100)
    parser.add_argument("--float32-trials", type=int, default=None,
                        help="trials per task for ansor's float32 model (default: --trials; 0 builds it from "
                             "the records the database already holds, e.g. a copy of a float32 tuning job's)")
    args = parser.parse_args()
    if args.model:
        quantized_model(args)
        return
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
