"""What setting up one measured program costs when timed as in a model: fresh copies of the
inputs for every program, or the task's copies kept between its programs (`InputCopies`).

    python benchmarks/measure_setup.py --model resnet18 --programs 2 --rounds 3

Samples `--programs` random programs of each of the model's tasks, compiles them, then in
turns (all of a task's programs one way, then all the other way, the order alternating by
round) builds the rotation of copies (`RotatedCalls`) the way the worker
does without and with the task's kept copies, and times its setup and teardown; the first
program of a task with kept copies pays for making them and is left out of the medians (it is
printed apart). `--whole` times the worker's whole `evaluate_kernel` instead (load, check, one
warm-up call and one timed call), which the kernels' own calls dominate.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from dataclasses import replace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--programs", type=int, default=2, help="random programs per task")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--whole", action="store_true", help="time evaluate_kernel, not the rotation alone")
    args = parser.parse_args()

    import ansor
    from ansor.backend.registry import build_programs
    from ansor.graph.model_tasks import extract_tasks
    from ansor.measure.check import unwritten_like
    from ansor.measure.input_copies import InputCopies
    from ansor.measure.library import KernelLibrary
    from ansor.measure.run import evaluate_kernel
    from ansor.measure.timing import RotatedCalls
    from ansor.memory import aligned_copy
    from ansor.pretrain.models import make_model
    from ansor.search.sketch_policy import SketchPolicy

    module, inputs = make_model(args.model)
    model = extract_tasks(ansor.graph.from_torch(module.eval(), inputs))
    policy = model.measured_as_in_model()
    one_call = replace(policy, warmup=0, repeat=1, min_repeat_ms=0.0)

    def rotation_seconds(lib_path: str, entry: str, ins, exp, copies) -> float:
        with KernelLibrary(lib_path, entry) as kernel:
            buffers = [aligned_copy(a) for a in ins] + [aligned_copy(unwritten_like(e)) for e in exp]
            buffers += kernel.packed_buffers()
            kernel.prepack(buffers)
            start = time.perf_counter()
            rotation = RotatedCalls(kernel, buffers, policy.cold_bytes, len(ins), copies)
            if copies is not None:
                copies.keep_if_unchanged(buffers[:len(ins)])
            del rotation
            return time.perf_counter() - start

    def whole_seconds(lib_path: str, entry: str, ins, exp, copies) -> float:
        start = time.perf_counter()
        result = evaluate_kernel(lib_path, entry, ins, exp, one_call, rtol=1e-3, atol=1e-3, input_copies=copies)
        if result.error_no != 0:
            raise RuntimeError(result.error_msg)
        return time.perf_counter() - start

    timed = whole_seconds if args.whole else rotation_seconds
    fresh, kept, first = [], [], []
    faults = {"fresh": 0, "kept": 0}  # minor page faults (fresh memory touched), per way
    for index, task in enumerate(model.tasks):
        states = SketchPolicy(task, seed=3).sample(args.programs)
        programs = [p for p in build_programs(states, task.target, "kernel") if p.ok]
        ins = task.random_inputs(0)
        exp = task.reference_outputs(ins)
        copies = InputCopies(ins)
        for r in range(args.rounds):
            # each way measures all the programs in a row, as the worker does: the memory one
            # program frees is what the allocator hands the next
            for mode in ("fresh", "kept") if r % 2 == 0 else ("kept", "fresh"):
                for j, program in enumerate(programs):
                    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    seconds = timed(program.build.lib_path, program.entry, ins, exp,
                                    copies if mode == "kept" else None)
                    if not (mode == "kept" and r == 0 and j == 0):
                        faults[mode] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
                    if mode == "kept" and r == 0 and j == 0:
                        first.append(seconds)
                    else:
                        (kept if mode == "kept" else fresh).append(seconds)
        copies.clear()
        print(f"task {index:2d} {task.name[:30]:30s} {len(programs)} programs", flush=True)
    what = "evaluate_kernel" if args.whole else "RotatedCalls setup + teardown"
    print(f"{what}, {len(fresh)} pairs: fresh copies median {statistics.median(fresh) * 1e3:.1f} ms "
          f"(mean {statistics.mean(fresh) * 1e3:.1f}), kept copies median {statistics.median(kept) * 1e3:.1f} ms "
          f"(mean {statistics.mean(kept) * 1e3:.1f}); a task's first program with kept copies: "
          f"mean {statistics.mean(first) * 1e3:.1f} ms; minor page faults per program: "
          f"fresh {faults['fresh'] / len(fresh):.0f}, kept {faults['kept'] / len(kept):.0f}")


if __name__ == "__main__":
    main()
