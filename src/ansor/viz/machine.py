"""What this machine can do: its cache sizes, its peak FMA throughput and its memory bandwidth.

A roofline needs the two peaks of the machine the kernel ran on, not a data sheet's: a VM's
share of a socket, its clock and its memory channels decide them. They are measured once, with
kernels compiled by ansor's own builder (the flags the tuned programs get), and kept in a JSON
file under the user cache directory keyed by the CPU model, the instruction set and the cores.

A measurement on a busy machine can be wrong by orders of magnitude (a run slowed once by the
thread start-up, never grown past it, gave 0.0 GFLOP/s), and a saved wrong peak would mislead
every later explanation. So each rate is timed in runs grown to a minimum duration, the best of
several rounds is kept, and peaks that cannot be right (`check_peaks`) are never saved.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import platform
import re
import subprocess
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ansor.backend import backend_for
from ansor.measure import Builder, MeasureErrorNo, default_cache_dir
from ansor.target import Target

#: Cache sizes assumed where neither sysfs nor lscpu tells them (a common desktop core).
FALLBACK_CACHES = ((1, 32 * 1024, 1), (2, 1024 * 1024, 1), (3, 8 * 1024 * 1024, 0))
PEAKS_FILE_FORMAT = 1
MiB = 1024 * 1024
#: Below these a measurement was disturbed, not the machine slow: a core of any CPU with vector
#: FMA does several GFLOP/s, and any memory system streams several GB/s.
MIN_PLAUSIBLE_GFLOPS_PER_CORE = 0.5
MIN_PLAUSIBLE_GBS = 0.5
#: A cache level may measure a little slower than the level beyond it (an L3 shared with other
#: tenants), not several times slower: bandwidth decreases outward through the hierarchy.
OUTWARD_BANDWIDTH_TOLERANCE = 0.5
#: The two peak kernels are the same loop on the same vectors, float32 with twice the lanes: its
#: peak is about twice float64's (once, without vectors), never far outside these ratios.
F32_OVER_F64 = (0.5, 4.0)


@dataclass(frozen=True)
class CacheLevel:
    """One level of the data-cache hierarchy: the size of one instance and how many cores share
    it (a tile running on every core gets `size / shared_by` of a shared cache)."""

    name: str
    size: int
    shared_by: int = 1


def cpu_caches(num_cores: int | None = None) -> tuple[CacheLevel, ...]:
    """This CPU's data caches, innermost first: from sysfs, else lscpu, else typical sizes."""
    cores = num_cores or os.cpu_count() or 1
    found = _sysfs_caches() or _lscpu_caches(cores)
    if not found:
        found = {level: (size, shared or cores) for level, size, shared in FALLBACK_CACHES}
    return tuple(CacheLevel(f"L{level}", size, max(1, min(shared, cores)))
                 for level, (size, shared) in sorted(found.items()))


def target_caches(target: Target) -> tuple[CacheLevel, ...]:
    """The memories a tile should fit in on `target`: the CPU's caches, or a GPU's shared memory
    per block (the one on-chip store the schedule sizes explicitly)."""
    if target.is_gpu:
        return (CacheLevel("shared", target.max_shared_memory_per_block, 1),) if target.max_shared_memory_per_block else ()
    return cpu_caches(target.num_cores)


def _size(text: str) -> int | None:
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMG]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        return None
    scale = {"": 1, "K": 1024, "M": MiB, "G": 1024 * MiB}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def _cpu_count(cpu_list: str) -> int:
    n = 0
    for part in cpu_list.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            n += int(hi) - int(lo) + 1
        elif part:
            n += 1
    return n


def _sysfs_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    try:
        entries = sorted(p for p in Path(root).iterdir() if p.name.startswith("index"))
        for p in entries:
            kind = (p / "type").read_text().strip()
            if kind not in ("Data", "Unified"):
                continue
            level = int((p / "level").read_text())
            size = _size((p / "size").read_text())
            shared_file = p / "shared_cpu_list"
            shared = _cpu_count(shared_file.read_text()) if shared_file.exists() else 1
            if size:
                out[level] = (size, shared)
    except (OSError, ValueError):
        return {}
    return out


def _lscpu_caches(cores: int) -> dict[int, tuple[int, int]]:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                              env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        m = re.match(r"\s*L([123])d? cache:\s*([\d.]+\s*[KMG]i?B?)(?:\s*\((\d+) instances?\))?", line)
        if not m:
            continue
        total = _size(m.group(2))
        instances = int(m.group(3) or 1)
        if total:
            out[int(m.group(1))] = (total // instances, max(1, cores // instances))
    return out


def cpu_model() -> str:
    """The CPU's model name (as /proc/cpuinfo says it), for keying measured peaks."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@dataclass(frozen=True)
class MachinePeaks:
    """Measured peaks of one CPU target: FMA throughput per element type and streaming memory
    bandwidth, with all the target's cores at work (as a tuned kernel runs)."""

    cpu: str
    isa: str
    cores: int
    peak_gflops: dict[str, float] = field(default_factory=dict)  # dtype -> GFLOP/s
    bandwidth_gbs: float = 0.0
    # the same triad on arrays that stay in a cache between calls: cache name -> (bytes the
    # target's cores hold of it together, GB/s). A kernel whose working set fits there is timed
    # warm (calls back to back), so that is its memory roof.
    cache_bandwidth: dict[str, tuple[int, float]] = field(default_factory=dict)

    def bandwidth_for(self, working_set: int) -> tuple[str, float]:
        """(where the data lives, GB/s) for a kernel touching `working_set` bytes per call,
        timed in repeated calls: the smallest measured cache that holds it, else memory."""
        for name, (size, gbs) in sorted(self.cache_bandwidth.items(), key=lambda kv: kv[1][0]):
            if working_set <= size and gbs > self.bandwidth_gbs:  # (a cache shared with other
                return name, gbs                                  # tenants may measure slower)
        return "memory", self.bandwidth_gbs

    @property
    def key(self) -> str:
        """The peaks file's key of this machine and target."""
        return machine_key(self.cpu, self.isa, self.cores)

    def peak_for(self, dtype: str) -> float | None:
        """Peak GFLOP/s for arithmetic on `dtype` (None when it was not measured)."""
        return self.peak_gflops.get(dtype)

    def to_dict(self) -> dict:
        """The JSON object kept in the peaks file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MachinePeaks:
        """Back from `to_dict`; KeyError, TypeError or ValueError for a damaged entry."""
        peaks = {str(k): float(v) for k, v in dict(data["peak_gflops"]).items()}
        caches = {str(k): (int(v[0]), float(v[1])) for k, v in dict(data.get("cache_bandwidth", {})).items()}
        return cls(str(data["cpu"]), str(data["isa"]), int(data["cores"]), peaks, float(data["bandwidth_gbs"]), caches)


def machine_key(cpu: str, isa: str, cores: int) -> str:
    """Peaks depend on the CPU, the instructions the kernels may use and the cores they run on."""
    return f"{cpu} | {isa} | {cores} cores"


def peaks_file() -> Path:
    """Where measured peaks are kept: beside the build cache (`$ANSOR_CACHE_DIR`, else the user
    cache directory), so they follow the same cache settings as the compiled kernels."""
    return default_cache_dir().parent / "machine.json"


def machine_peaks(target: Target | None = None, refresh: bool = False, path: str | os.PathLike | None = None,
                  on_measure: Callable[[str], object] | None = None, *, replace: bool = False,
                  achieved_gflops: Mapping[str, float] | None = None,
                  on_warning: Callable[[str], object] | None = None) -> MachinePeaks | None:
    """The peaks of a CPU target: read from the peaks file, else measured (a second or two) and
    written there. None for GPU targets (this machine's CPU says nothing about them), and None
    when the measurement is implausible even after a second try: such peaks are not saved.

    Args:
        refresh: Measure again even when the file has peaks; the best of the new and the saved
            ones is kept (other load only ever lowers a measured peak)...
        replace: ... unless `replace`: then the new measurement replaces the saved one.
        achieved_gflops: Throughputs some kernel reached (dtype -> GFLOP/s): a peak below them
            is rejected, the saved ones (then measured again) as well as new ones.
        on_measure: Told before a measurement starts.
        on_warning: Told, in one line, why peaks were rejected (default: `warnings.warn`).
    """
    target = target or Target.host()
    if target.is_gpu:
        return None
    warn = on_warning or (lambda message: warnings.warn(message, RuntimeWarning, stacklevel=3))
    file = Path(path) if path is not None else peaks_file()
    key = machine_key(cpu_model(), target.isa, target.num_cores)
    table = _read_peaks(file)
    saved = _entry(table, key)
    if saved is not None and not refresh:
        problems = check_peaks(saved, achieved_gflops)
        if not problems:
            return saved
        warn(f"the saved peaks of this machine are implausible ({problems[0]}); measuring them again")
    if saved is not None and check_peaks(saved):
        saved = None  # wrong in itself (saved before peaks were checked): nothing to keep of it
    if on_measure is not None:
        on_measure(f"measuring this machine's peak FLOP/s and memory bandwidth (kept in {file})")
    peaks = measure_peaks(target)
    if check_peaks(peaks, achieved_gflops):  # a busy moment: one more try, keeping the best of both
        peaks = _best_of(measure_peaks(target), peaks)
    if saved is not None and not replace:
        peaks = _best_of(peaks, saved)
    problems = check_peaks(peaks, achieved_gflops)
    if problems:
        warn(f"this machine's peaks measured implausibly ({problems[0]}; is it busy?): not saved, no roofs")
        return None
    table[key] = peaks.to_dict()
    _write_peaks(file, table)
    return peaks


def check_peaks(peaks: MachinePeaks, achieved_gflops: Mapping[str, float] | None = None) -> list[str]:
    """What makes measured peaks implausible, one phrase each (empty: plausible): a peak or a
    bandwidth of zero or below the floor any CPU reaches, a cache slower than the level beyond
    it (bandwidth decreases outward, within `OUTWARD_BANDWIDTH_TOLERANCE`), float32 and float64
    peaks out of proportion (`F32_OVER_F64`), or a peak below what a kernel was measured to
    reach."""
    problems = []
    floor = MIN_PLAUSIBLE_GFLOPS_PER_CORE * max(1, peaks.cores)
    if not peaks.peak_gflops:
        problems.append("no peak FLOP/s")
    for dtype, gflops in sorted(peaks.peak_gflops.items()):
        if not math.isfinite(gflops) or gflops < floor:
            problems.append(f"{dtype} peak {gflops:.3g} GFLOP/s on {peaks.cores} cores, below {floor:g}")
    levels = [(name, gbs) for name, (_, gbs) in sorted(peaks.cache_bandwidth.items(), key=lambda kv: kv[1][0])]
    levels.append(("memory", peaks.bandwidth_gbs))
    for name, gbs in levels:
        if not math.isfinite(gbs) or gbs < MIN_PLAUSIBLE_GBS:
            problems.append(f"{name} bandwidth {gbs:.3g} GB/s, below {MIN_PLAUSIBLE_GBS:g}")
    f32, f64 = peaks.peak_for("float32"), peaks.peak_for("float64")
    if f32 and f64 and not F32_OVER_F64[0] <= f32 / f64 <= F32_OVER_F64[1]:
        problems.append(f"float32 peak {f32:.3g} and float64 peak {f64:.3g} GFLOP/s disagree")
    for (inner, inner_gbs), (outer, outer_gbs) in zip(levels, levels[1:]):
        if inner_gbs < OUTWARD_BANDWIDTH_TOLERANCE * outer_gbs:
            problems.append(f"{inner} bandwidth {inner_gbs:.3g} GB/s, below {outer}'s {outer_gbs:.3g}")
    for dtype, achieved in sorted((achieved_gflops or {}).items()):
        peak = peaks.peak_for(dtype)
        if peak is not None and achieved is not None and achieved > peak:
            problems.append(f"{dtype} peak {peak:.3g} GFLOP/s, below the {achieved:.3g} a kernel reached")
    return problems


def _entry(table: dict, key: str) -> MachinePeaks | None:
    """The saved peaks under `key`; None where there are none or the entry is damaged."""
    if key not in table:
        return None
    try:
        return MachinePeaks.from_dict(table[key])
    except (KeyError, TypeError, ValueError):
        return None


def _best_of(a: MachinePeaks, b: MachinePeaks) -> MachinePeaks:
    """Field by field, the higher of two measurements of one machine."""
    dtypes = set(a.peak_gflops) | set(b.peak_gflops)
    peak = {d: max(a.peak_gflops.get(d, 0.0), b.peak_gflops.get(d, 0.0)) for d in dtypes}
    caches = dict(b.cache_bandwidth)
    for name, (size, gbs) in a.cache_bandwidth.items():
        caches[name] = (size, max(gbs, caches.get(name, (size, 0.0))[1]))
    return replace(a, peak_gflops=peak, bandwidth_gbs=max(a.bandwidth_gbs, b.bandwidth_gbs), cache_bandwidth=caches)


def _read_peaks(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != PEAKS_FILE_FORMAT or not isinstance(data.get("machines"), dict):
        return {}
    return dict(data["machines"])


def _write_peaks(file: Path, table: dict) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": PEAKS_FILE_FORMAT, "machines": table}, indent=1, sort_keys=True))
    os.replace(tmp, file)


# --- measurement ---------------------------------------------------------------------------

_C_TYPES = {"float32": ("float", 4), "float64": ("double", 8)}


def peak_source(vector_bytes: int, accumulators: int) -> str:
    """C for the peak kernels: per element type, every thread updates `accumulators` independent
    vectors with a multiply-add each step (enough of them to cover the FMA latency on every
    port), and a triad `a = b + s*c` streams three arrays for the bandwidth, `reps` times in
    one parallel region: each thread repeats its own share without waiting for the others (a
    region or a barrier per repetition, on a busy machine, times the waiting, not the cache)."""
    lines = ["#include <omp.h>", ""]
    for dtype, (ctype, size) in _C_TYPES.items():
        lanes = max(1, vector_bytes // size)
        vt = f"v_{dtype}"
        lines.append(f"typedef {ctype} {vt} __attribute__((vector_size({lanes * size})));")
        accs = [f"a{k}" for k in range(accumulators)]
        init = ", ".join(f"{a} = ({vt}){{}} + ({ctype})(t + {k + 1})" for k, a in enumerate(accs))
        lines += [
            f"double ansor_peak_{dtype}(long iters, int threads) {{",
            "  double total = 0.0;",
            "  #pragma omp parallel num_threads(threads) reduction(+:total)",
            "  {",
            "    int t = omp_get_thread_num();",
            f"    {vt} m = ({vt}){{}} + ({ctype})0.999999, c = ({vt}){{}} + ({ctype})1e-6;",
            f"    {vt} {init};",
            "    for (long i = 0; i < iters; ++i) {",
            *[f"      {a} = {a} * m + c;" for a in accs],
            "    }",
            f"    {vt} s = {' + '.join(accs)};",
            f"    for (int l = 0; l < {lanes}; ++l) total += s[l];",
            "  }",
            "  return total;",
            "}",
            "",
        ]
    lines += [
        "void ansor_triad(float *restrict a, const float *restrict b, const float *restrict c, long n, long reps,",
        "                 int threads) {",
        "  #pragma omp parallel num_threads(threads)",
        "  for (long r = 0; r < reps; ++r) {",
        "    float s = 0.5f + 1e-7f * (float)r;",
        "    #pragma omp for simd schedule(static) nowait",
        "    for (long i = 0; i < n; ++i) a[i] = b[i] + s * c[i];",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def measure_peaks(target: Target | None = None, seconds: float = 0.25, stream_bytes: int | None = None,
                  builder: Builder | None = None) -> MachinePeaks:
    """Measure the peaks of a CPU target now: FMA throughput (float32 and float64) and the
    bandwidth of a triad over three arrays of `stream_bytes` each (default: twice the last-level
    cache, between 64 and 256 MiB), counted as STREAM counts it (two reads and a write per
    element). `seconds` is about how long each measurement runs; `builder` compiles the kernels
    (default: the target's own, with the flags its programs get)."""
    target = target or Target.host()
    if target.is_gpu:
        raise ValueError(f"peaks are measured on this machine's CPU, not on {target.key}")
    accumulators = 16 if target.vector_registers >= 32 else 10
    source = peak_source(target.vector_unit_bytes, accumulators)
    builder = builder or backend_for(target).builder(target)
    built = builder.compile_one(source)
    if built.error_no != MeasureErrorNo.NO_ERROR or built.lib_path is None:
        raise RuntimeError(f"compiling the peak-measurement kernels failed: {built.error_msg}")
    lib = ctypes.CDLL(built.lib_path)
    threads = target.num_cores
    peaks = {}
    for dtype, (_, size) in _C_TYPES.items():
        fn = getattr(lib, f"ansor_peak_{dtype}")
        fn.argtypes, fn.restype = [ctypes.c_long, ctypes.c_int], ctypes.c_double
        lanes = max(1, target.vector_unit_bytes // size)
        flop_per_iter = 2.0 * accumulators * lanes * threads
        peaks[dtype] = _best_rate(lambda n: fn(n, threads), flop_per_iter, seconds) / 1e9
    if stream_bytes is None:
        llc = max((c.size for c in cpu_caches(threads)), default=8 * MiB)
        stream_bytes = min(max(2 * llc, 64 * MiB), 256 * MiB)
    n = max(1024, stream_bytes // 4)
    a, b, c = (np.ones(n, dtype=np.float32) for _ in range(3))  # pages touched before timing
    triad = lib.ansor_triad
    triad.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int]
    ptrs = (a.ctypes.data, b.ctypes.data, c.ctypes.data)
    bandwidth = _best_rate(lambda reps: triad(*ptrs, n, reps, threads), 12.0 * n, seconds) / 1e9
    cache_bandwidth = {}
    for level in cpu_caches(threads):
        if level.name == "L1":
            continue
        capacity = level.size * max(1, threads // level.shared_by)  # what the cores hold of it together
        if capacity >= stream_bytes * 3 or capacity < 6 * 4096:
            continue
        m = capacity // 24  # three arrays filling half of it, so they stay there
        xs = [np.ones(m, dtype=np.float32) for _ in range(3)]
        p3 = tuple(x.ctypes.data for x in xs)
        gbs = _best_rate(lambda reps: triad(*p3, m, reps, threads), 12.0 * m, seconds) / 1e9
        cache_bandwidth[level.name] = (capacity, gbs)
    return MachinePeaks(cpu_model(), target.isa, target.num_cores, peaks, bandwidth, cache_bandwidth)


#: Rounds of a rate measurement, the fastest kept; how often a round that ran shorter than the
#: minimum duration (its run count was sized from a probe slowed by the machine) grows it; and
#: how much longer than its minimum duration growing may take in all.
RATE_ROUNDS = 5
MAX_REGROWTHS = 4
GROWTH_BUDGET = 10
MIN_GROWTH_SECONDS = 1.0
MAX_UNITS = 1 << 40
#: Doubling the work of a run long enough to time must make it this much longer; less, and
#: fixed costs (waking threads on a busy machine) still dominate it.
SCALING = 1.6
SCALED_SECONDS = 0.1


def _best_rate(run: Callable[[int], object], work_per_unit: float, seconds: float) -> float:
    """Work per second of `run(units)`: the fastest of `RATE_ROUNDS` runs, each grown to last
    at least `seconds / RATE_ROUNDS` and until its time scales with its work.

    One untimed run comes first (threads started, code and pages touched). A run count grows
    until a run lasts the minimum duration and twice the count takes about twice as long: on a
    busy machine a parallel region can cost milliseconds of waiting for its threads, and a rate
    timed on runs that short measures the waiting (0.0 GFLOP/s). Where the rounds still run
    shorter than the minimum (the run that sized them was slowed), the count grows again."""
    min_seconds = max(seconds / RATE_ROUNDS, 1e-4)

    def timed(units: int) -> float:
        start = time.perf_counter()
        run(units)
        return time.perf_counter() - start

    def grown(units: int, elapsed: float) -> int:
        wanted = int(1.2 * units * min_seconds / max(elapsed, 1e-9)) + 1
        return min(MAX_UNITS, max(2 * units, wanted))

    run(1)
    deadline = time.perf_counter() + max(GROWTH_BUDGET * seconds, MIN_GROWTH_SECONDS)
    units = 1
    elapsed = timed(units)
    while units < MAX_UNITS and time.perf_counter() < deadline:
        if elapsed < min_seconds:
            units = grown(units, elapsed)
            elapsed = timed(units)
            continue
        if elapsed >= SCALED_SECONDS:
            break  # waiting for threads is milliseconds: a run this long is mostly work
        doubled = timed(2 * units)
        if doubled >= SCALING * elapsed:
            break
        units = min(MAX_UNITS, 8 * units)  # far from scaling: grow fast, the waiting is fixed
        elapsed = timed(units)
    best = min(timed(units) for _ in range(RATE_ROUNDS))
    for _ in range(MAX_REGROWTHS):
        if best >= min_seconds / 2 or units >= MAX_UNITS:
            break
        units = grown(units, best)
        best = min(timed(units) for _ in range(RATE_ROUNDS))
    return work_per_unit * units / max(best, 1e-12)
