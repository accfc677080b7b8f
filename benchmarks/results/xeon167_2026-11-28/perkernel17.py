"""Each linear of the bucket-32 model at length 17, ragged tiles on and off, timed alternately."""
import sys, time, os
sys.path.insert(0, os.getcwd())
import numpy as np, torch
import ansor
import ansor.lower.live_rows as lr
from ansor.kernel import compile_state
from dynamic_lengths import decoder_block
block = decoder_block(256, 4, 0)
seq = torch.export.Dim("seq", max=512)
graph = ansor.graph.from_torch(block, (torch.zeros(1, 8, 256),), dynamic_shapes={"x": {1: seq}})
compiled = ansor.build(graph, database="/tmp/db/dyn.db", verbose=False)
b = [i for i, bk in enumerate(compiled.buckets) if bk.sizes["seq"] == 32][0]
specs = {key: spec for key, (dim, spec) in compiled.buckets[b].live_rows().items()}
model = compiled.models[b]
real = lr._ragged_rows
rng = np.random.default_rng(0)
length = int(sys.argv[1]) if len(sys.argv) > 1 else 17
for name, k in model.kernels.items():
    if "linear" not in k.task.name: continue
    spec = specs[k.task.workload_key]
    lr._ragged_rows = real
    on = compile_state(k.task, k.state, live_rows=spec)
    lr._ragged_rows = lambda *a, **kw: None
    off = compile_state(k.task, k.state, live_rows=spec)
    lr._ragged_rows = real
    assert "kept rows only" in on.source and "kept rows only" not in off.source
    args = [rng.standard_normal(t.shape).astype(np.float32) for t in k.task.inputs]
    for kern in (on, off):
        kern.set_live_rows(length)
    a, b2 = on(*args), off(*args)
    assert np.array_equal(a, b2)
    calls = {"on": on.prepared(*args), "off": off.prepared(*args)}
    times = {"on": [], "off": []}
    for r in range(9):
        for label, kern in (("on", on), ("off", off)):
            t0 = time.perf_counter()
            call = calls[label]
            for _ in range(200): call()
            times[label].append((time.perf_counter() - t0) / 200 * 1e6)
    m = {l: float(np.median(v)) for l, v in times.items()}
    print(f"{k.task.name:28s} on {m['on']:7.1f} us  off {m['off']:7.1f} us  off/on {m['off']/m['on']:.2f}", flush=True)
