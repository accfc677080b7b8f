"""Every search parameter with its default, in one typed table (after Ansor's SketchPolicy).

`SearchParams` is frozen: a policy's parameters cannot drift during a job, and the same object
travels to the worker processes. `search_params(overrides)` refuses unknown names, so a typo is
an error rather than a silently ignored setting. Why each default is what it is, with the
measurements behind it, is in BENCHMARKS.md and docs/DESIGN.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping


def _default_mutation_weights() -> dict[str, float]:
    # the reference's; "tile_shape" (a factor moved between two axes' innermost tiles) can be
    # given a weight too, and is off by default
    return {"tile_size": 0.90, "auto_unroll": 0.04, "compute_location": 0.05, "parallel": 0.01}


#: The reference's mutation weights on GPUs: tile sizes and unrolling only (compute locations
#: are fixed by the GPU sketch rules, and nothing is parallel).
GPU_MUTATION_WEIGHTS = {"tile_size": 0.90, "auto_unroll": 0.10}


@dataclass(frozen=True)
class SearchParams:
    """The knobs of sketch generation, random annotation, sampling and evolution."""

    # sketch generation
    cpu_multi_level_tiling_structure: str = "SSRSRS"
    cpu_fusion_levels: tuple[int, ...] = (1, 2)
    cpu_pack_reused_operands: bool = True     # also sketch copies of B-like inputs in a tiled layout
    # random annotation
    max_innermost_split_factor: int = 64      # innermost tile length bound
    max_reduction_block: int = 1024           # bound of the reduction block of a tiled stage (the inner
                                              # length of its reduction split, which is never its
                                              # innermost loop): a block of 512-1024 keeps a weight
                                              # panel in L2 while the row tiles pass (BENCHMARKS.md);
                                              # GPU searches keep max_innermost_split_factor
    vector_tile_bias: bool = True             # half the innermost tile draws: a multiple of the vector lanes
    register_tile_prob: float = 0.25          # share of programs whose spatial tiles are register tiles
                                              # (second innermost spatial level 1 on every axis)
    blocked_register_tile_prob: float = 0.5   # share of the register tiles blocked as BLAS blocks a GEMM:
                                              # a long reduction block over a sweep of tiles down the
                                              # rows (`annotate.fill_tile_sizes`)
    register_tile_vectors: int = 0            # accumulator vectors a register tile may fill; 0: three
                                              # quarters of the target's vector registers (the rest hold
                                              # one reduction step's operands)
    max_vectorize_size: int = 64              # elements in a vectorized loop
    auto_unroll_max_step_choices: tuple[int, ...] = (0, 16, 64, 512)
    gpu_auto_unroll_max_step_choices: tuple[int, ...] = (0, 16, 64, 512, 1024)
    gpu_max_thread_tile: int = 64             # values one GPU thread accumulates in registers
    parallel_degree_per_core: int = 16        # stop fusing outer loops beyond 16 x cores
    min_parallel_per_core: int = 4            # fuse at least up to 4 x cores parallel iterations
    disable_change_compute_location: bool = False
    fused_location_prob: float = 0.25         # share of programs whose free reductions (and the free
                                              # stages after them) all go into consumer loops (the
                                              # reference draws each stage alone)
    # sampling
    sample_init_min_population: int = 50
    sample_init_fresh_ratio: float = 0.25     # share of a round's random programs drawn anew; the rest
                                              # are earlier rounds' unmeasured draws (features cached)
    sample_pool_size: int = 8192              # earlier draws kept for reuse
    max_sample_tries: int = 8                 # draws per requested program before giving up
    # evolutionary search
    evolutionary_search_population: int = 2048  # the most a round evolves (the reference's, for 64)
    population_per_program: int = 32          # a round of n programs evolves 32 n of them (the reference's
                                              # 2048 for 64), at least min_evolved_population: a
                                              # model's rounds are smaller than 64, and the search
                                              # then cost more per measured program than measuring
    min_evolved_population: int = 512
    evolutionary_search_num_iters: int = 4
    evolutionary_search_mutation_prob: float = 0.85
    crossover_prob: float = 0.05
    sample_init_use_measured_ratio: float = 0.2
    eps_greedy: float = 0.05
    max_picks_per_tiling: int = 8             # a batch measures at most this many programs with the same
                                              # multi-level tiling (0: no limit; the reference has none)
    max_picks_per_inner_tile: int = 16        # ... and with the same innermost tile shape (0: no limit),
                                              # so that a batch is not spent on one register tile
    first_picks_per_sketch: bool = True       # while nothing of the task is measured, a round first
                                              # measures the model's best program of each sketch
    feature_cache_size: int = 100_000         # programs whose features are kept between rounds
    search_workers: int = 0                   # processes breeding children and extracting features
                                              # (0: one per core; 1: all in the search process)
    mutation_weights: Mapping[str, float] = field(default_factory=_default_mutation_weights)

    def replace(self, **overrides: Any) -> SearchParams:
        """A copy with some parameters changed; unknown names are an error."""
        return search_params(overrides, base=self)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The defaults as a plain dict (for printing and for scripts that list the knobs).
SEARCH_DEFAULTS: dict[str, Any] = asdict(SearchParams())


def search_params(overrides: Mapping[str, Any] | SearchParams | None = None,
                  base: SearchParams | None = None) -> SearchParams:
    """The defaults (or `base`) with `overrides` applied; unknown keys are an error (typos must
    not pass). A SearchParams object is returned as it is."""
    if isinstance(overrides, SearchParams):
        return overrides
    known = {f.name for f in fields(SearchParams)}
    unknown = sorted(set(overrides or {}) - known)
    if unknown:
        raise KeyError(f"unknown search parameter{'s' if len(unknown) > 1 else ''} "
                       f"{', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}")
    values = dict(overrides or {})
    for name in ("cpu_fusion_levels", "auto_unroll_max_step_choices", "gpu_auto_unroll_max_step_choices"):
        if name in values:
            values[name] = tuple(values[name])
    return replace(base or SearchParams(), **values)
