"""Every search parameter with its default, in one table (after Ansor's SketchPolicy)."""

from __future__ import annotations

SEARCH_DEFAULTS: dict[str, object] = {
    # sketch generation
    "cpu_multi_level_tiling_structure": "SSRSRS",
    "cpu_fusion_levels": (1, 2),
    "cpu_pack_reused_operands": True,     # also sketch copies of B-like inputs in a tiled layout
    # random annotation
    "max_innermost_split_factor": 64,     # innermost tile length bound
    "vector_tile_bias": True,             # half the innermost tile draws: a multiple of the vector lanes
    "register_tile_prob": 0.25,           # share of programs whose spatial tiles are register tiles
                                          # (second innermost spatial level 1 on every axis)
    "register_tile_vectors": 0,           # accumulator vectors a register tile may fill; 0: three
                                          # quarters of the target's vector registers (24 of AVX-512's
                                          # 32, 12 of AVX2's 16: the rest hold one reduction step's operands)
    "max_vectorize_size": 64,             # elements in a vectorized loop (64 floats: 4 zmm registers)
    "auto_unroll_max_step_choices": (0, 16, 64, 512),
    "parallel_degree_per_core": 16,       # stop fusing outer loops beyond 16 x cores
    "min_parallel_per_core": 4,           # fuse at least up to 4 x cores parallel iterations
    "disable_change_compute_location": False,
    "fused_location_prob": 0.25,          # share of programs whose free reductions (and the free stages
                                          # after them) all go into consumer loops (ours; the reference
                                          # draws each stage alone)
    # sampling
    "sample_init_min_population": 50,
    "sample_init_fresh_ratio": 0.25,      # share of a round's random programs drawn anew; the rest
                                          # are earlier rounds' unmeasured draws (features cached)
    "sample_pool_size": 8192,             # earlier draws kept for reuse
    "max_sample_tries": 8,                # draws per requested program before giving up
    # evolutionary search
    "evolutionary_search_population": 2048,
    "evolutionary_search_num_iters": 4,
    "evolutionary_search_mutation_prob": 0.85,
    "crossover_prob": 0.05,
    "sample_init_use_measured_ratio": 0.2,
    "eps_greedy": 0.05,
    "max_picks_per_tiling": 8,            # a batch measures at most this many programs with the same
                                          # multi-level tiling (0: no limit; the reference has none)
    "max_picks_per_inner_tile": 16,       # ... and with the same innermost tile shape (0: no limit):
                                          # batches kept re-measuring one register tile (8x8) while
                                          # 4x16 was never tried
    "feature_cache_size": 100_000,        # programs whose features are kept between rounds
    "search_workers": 0,                  # processes breeding children and extracting features
                                          # (0: one per core; 1: all in the search process)
    "mutation_weights": {"tile_size": 0.90, "auto_unroll": 0.04, "compute_location": 0.05, "parallel": 0.01},
                                          # the reference's; "tile_shape" (ours, off: see BENCHMARKS.md)
                                          # can be given a weight too
}


def search_params(overrides: dict | None = None) -> dict:
    """The defaults with `overrides` applied; unknown keys are an error (typos must not pass)."""
    params = dict(SEARCH_DEFAULTS)
    for key, value in (overrides or {}).items():
        if key not in params:
            raise KeyError(f"unknown search parameter {key!r}; known: {', '.join(sorted(params))}")
        params[key] = value
    return params
