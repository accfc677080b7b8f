"""SketchPolicy: Ansor's search. Sketches are derived once; each round samples a population of
randomly annotated programs, seeds it with the best measured ones, evolves it under a cost
model, and proposes the best predicted unmeasured programs plus a few random ones
(eps-greedy). Without a cost model it is plain random sampling of the sketch space.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import fields
from typing import Mapping, Sequence

from ansor.records import Record
from ansor.replay import replay_records
from ansor.schedule.state import State
from ansor.search.annotate import multi_level_splits
from ansor.search.annotate_gpu import annotate_program, gpu_hardware
from ansor.search.collector import collector_paused
from ansor.search.params import GPU_MUTATION_WEIGHTS, SearchParams, search_params
from ansor.search.policy import MeasureResult, SearchPolicy
from ansor.search.sketch_dot_product import DOT_PRODUCT_RULE
from ansor.search.sketch import CPU_RULES, Sketch, SketchContext, SketchRule, generate_sketches
from ansor.search.sketch_gpu import GPU_RULES
from ansor.search.template import TEMPLATE_RULE
from ansor.task import Task


class SketchPolicy(SearchPolicy):
    """Samples complete programs: a sketch drawn uniformly, then random annotation; with a cost
    model, evolves them and proposes the most promising."""

    def __init__(self, task: Task, seed: int | None = None, params: Mapping[str, object] | SearchParams | None = None,
                 custom_rules: Sequence[SketchRule] = (), cost_model=None):
        super().__init__(task, seed)
        self.params = search_params(params)
        target = task.target
        given = params if isinstance(params, Mapping) else {}
        if target.is_gpu and "mutation_weights" not in given:
            self.params = self.params.replace(mutation_weights=dict(GPU_MUTATION_WEIGHTS))
        if target.is_gpu and "max_reduction_block" not in given:
            # a GPU block stages its reduction block in shared memory: bounded like any tile
            self.params = self.params.replace(max_reduction_block=self.params.max_innermost_split_factor)
        self.rng = random.Random(seed)
        self.cost_model = cost_model
        ctx = SketchContext(target, self.params.cpu_multi_level_tiling_structure,
                            tuple(self.params.cpu_fusion_levels), self.params.cpu_pack_reused_operands)
        # a template stage has its own sketch, and so has a stage a dot-product instruction computes
        rules = GPU_RULES if target.is_gpu else (TEMPLATE_RULE, DOT_PRODUCT_RULE, *CPU_RULES)
        self.sketches: list[Sketch] = generate_sketches(State(task.dag), ctx, custom_rules, base_rules=rules)
        if not self.sketches:
            raise ValueError(f"no sketch could be derived for task {task.name!r}")
        self.vector_lanes = target.vector_unit_bytes // 4 if self.params.vector_tile_bias and not target.is_gpu else 0
        # what annotation needs of the machine: a GPU's block limits, or the CPU's cores, float32
        # lanes and vector registers
        self.hardware = (gpu_hardware(target, self.params.gpu_max_thread_tile) if target.is_gpu
                         else (target.num_cores, self.vector_lanes, target.vector_registers))
        self.measured: list[tuple[float, State]] = []  # (cost, program) of successful measurements
        self.last_round: dict[str, float] = {}         # seconds per phase of the last round
        self._feature_cache: dict = {}
        self._sample_pool: list = []  # random programs drawn in earlier rounds, newest last
        self._workers = None  # SearchWorkers, started on first use
        self._timers = {"features": 0.0, "predict": 0.0}

    # --- sampling ---------------------------------------------------------------------------
    def sample(self, n: int, exclude: set[str] | None = None) -> list[State]:
        """Up to n distinct complete programs whose key is not in `exclude`."""
        out: list[State] = []
        seen = set(exclude or ())
        tries = 0
        max_tries = n * self.params.max_sample_tries + 16
        while len(out) < n and tries < max_tries:
            tries += 1
            sketch = self.rng.choice(self.sketches)
            st = annotate_program(sketch.steps, self.task.dag, self.rng, self.params, self.hardware)
            if st is None:
                continue
            key = st.key()
            if key in seen:
                continue
            seen.add(key)
            out.append(st)
        return out

    def sample_population(self, n: int, exclude: set[str]) -> list:
        """Like `sample`, but in the worker processes when there are any, with the programs'
        features computed there too (they are all scored next)."""
        workers = self.workers()
        if workers is None or not workers.worth_parallel(n):
            return self.sample(n, exclude)
        out: list = []
        seen = set(exclude)
        sketches = [tuple(s.steps) for s in self.sketches]
        for _ in range(self.params.max_sample_tries):
            want = n - len(out)
            if want <= 0:
                break
            # a few more than wanted, for the duplicates (a few percent of draws, BENCHMARKS.md);
            # a shortfall is drawn in the next pass
            drawn = workers.sample(sketches, want + want // 32 + 8, self.rng.randrange(2**31), self.params,
                                   self.hardware, self._feature_cache)
            for g in drawn:
                if g is not None and g.key() not in seen and len(out) < n:
                    seen.add(g.key())
                    out.append(g)
        return out

    def initial_population(self, n: int, measured_keys: set[str]) -> list:
        """n distinct unmeasured random programs for a round: a fresh share
        (`sample_init_fresh_ratio`) drawn now, the rest picked from earlier rounds' draws.
        A random program is as random in its second round as in its first, and its features
        are already cached, so reuse saves most of the sampling and featurizing time while
        the pool keeps growing with every round's fresh draws."""
        p = self.params
        pool = [g for g in self._sample_pool if g.key() not in measured_keys]
        n_fresh = n if not pool else min(n, max(1, math.ceil(p.sample_init_fresh_ratio * n)))
        n_reused = min(len(pool), n - n_fresh)
        fresh = self.sample_population(n - n_reused, measured_keys | {g.key() for g in pool})
        reused = self.rng.sample(pool, n_reused)
        self._sample_pool = (pool + fresh)[-p.sample_pool_size:]
        return fresh + reused

    # --- one round --------------------------------------------------------------------------
    def next_batch(self, n: int, measured_keys: set[str], deadline: float | None = None) -> list[State]:
        # while a learned model is still warming up its scores are random: evolving a population
        # on them would cost a full search round and pick random programs anyway
        if self.cost_model is None or getattr(self.cost_model, "trusted", True) is False:
            return self.sample(n, measured_keys)
        return self.search_round(n, measured_keys, deadline)

    def features(self, states: Sequence[State]) -> list:
        """Program features, cached across rounds (evolution revisits many programs)."""
        from ansor.costmodel.features import features_for_states

        if len(self._feature_cache) > self.params.feature_cache_size:
            self._feature_cache.clear()
        return features_for_states(states, memo=self._feature_cache, extract=self.workers(),
                                   target=self.task.target)

    def workers(self):
        """The worker pool (None when the search runs in one process)."""
        if self._workers is None and self.params.search_workers != 1:
            from ansor.search.workers import SearchWorkers

            self._workers = SearchWorkers(self.task.dag, self.params.search_workers or None,
                                          target=self.task.target)
        return self._workers

    def breed(self, orders: list, seed: int) -> list:
        """Children for evolution, bred where their features are extracted."""
        from ansor.search.evolution import breed_locally

        workers = self.workers()
        cores = 1 if self.task.target.is_gpu else self.task.target.num_cores
        if workers is None:
            return breed_locally(orders, seed, self.params, cores)
        t0 = time.perf_counter()
        children = workers.breed(orders, seed, self.params, self._feature_cache, cores)
        self._timers["breed"] += time.perf_counter() - t0
        return children

    def score(self, states: Sequence[State]):
        """Predicted fitness (higher is faster) of complete programs."""
        t0 = time.perf_counter()
        feats = self.features(states)
        t1 = time.perf_counter()
        scores = self.cost_model.predict(feats)
        self._timers["features"] += t1 - t0
        self._timers["predict"] += time.perf_counter() - t1
        return scores

    def search_round(self, n: int, measured_keys: set[str], deadline: float | None = None) -> list[State]:
        """Evolve a fresh population plus the best measured programs; return n unmeasured
        programs: the best predicted and an eps-greedy share of random ones. The population
        holds Genomes (steps and key) where programs came from workers; picks are replayed.
        Evolution breeds no generation past `deadline` (a `time.time()` value)."""
        with collector_paused():  # a round makes no reference cycles, only many objects
            return self._search_round(n, measured_keys, deadline)

    def _search_round(self, n: int, measured_keys: set[str], deadline: float | None) -> list[State]:
        from ansor.search.evolution import as_state, evolve

        p = self.params
        self._timers = {"features": 0.0, "predict": 0.0, "breed": 0.0}
        t0 = time.perf_counter()
        population = self.population_for(n)
        n_measured = min(len(self.measured), int(p.sample_init_use_measured_ratio * population))
        init = self.initial_population(population - n_measured, measured_keys)
        best_measured = [st for _, st in sorted(self.measured, key=lambda t: t[0])[:n_measured]]
        t1 = time.perf_counter()
        n_random = int(p.eps_greedy * n)
        stats: dict = {}
        ranked = evolve(init + best_measured, self.score, self.rng, p, measured_keys, out_size=4 * n, stats=stats,
                        breed=self.breed, deadline=deadline)
        t2 = time.perf_counter()
        picks: list[State] = []
        chosen: set[str] = set()
        firsts = (self.best_of_each_sketch([st for _, st in ranked], init, (n - n_random) // 2)
                  if p.first_picks_per_sketch and not self.measured else [])
        for st in firsts + diverse_best([st for _, st in ranked], n - n_random, p.max_picks_per_tiling,
                                        p.max_picks_per_inner_tile):
            if len(picks) >= n - n_random:
                break
            if st.key() in chosen:
                continue
            picks.append(as_state(st))
            chosen.add(st.key())
        pool = [st for st in init if st.key() not in chosen and st.key() not in measured_keys]
        self.rng.shuffle(pool)
        for st in pool:
            if len(picks) >= n:
                break
            picks.append(as_state(st))
            chosen.add(st.key())
        feat_s, pred_s, breed_s = self._timers["features"], self._timers["predict"], self._timers["breed"]
        self.last_round = {"sample_s": t1 - t0, "features_s": feat_s, "predict_s": pred_s,
                           "breed_s": breed_s, "evolution_s": t2 - t1 - feat_s - pred_s - breed_s,
                           "total_s": time.perf_counter() - t0,
                           **{f"children_{k}": v for k, v in stats.items()}}
        return picks

    def population_for(self, n: int) -> int:
        """The population a round of n programs evolves: `population_per_program` per program,
        between `min_evolved_population` and `evolutionary_search_population`."""
        p = self.params
        return min(p.evolutionary_search_population, max(p.min_evolved_population, p.population_per_program * n))

    def best_of_each_sketch(self, ranked: Sequence, population: Sequence, limit: int) -> list:
        """The model's best program of each sketch, at most `limit`, for a round of a task with
        nothing measured: a model that has never seen this workload (the pretrained one) can
        rate a whole sketch low, and then no program of it is measured and nothing corrects it
        (a pooling sketch added after the model was trained went unmeasured for 64 trials).
        One program of each costs a few measurements and shows the refitted model every
        structure. Sketches with no program among the evolved `ranked` take the best scored
        one of the random `population`."""
        if limit <= 0 or len(self.sketches) < 2:
            return []
        prefixes = [sketch_structure(s.steps) for s in self.sketches]
        best: dict[int, object] = {}
        for st in ranked:  # best first
            k = sketch_index(st, prefixes)
            if k is not None and k not in best:
                best[k] = st
        missing = [(k, st) for st in population if (k := sketch_index(st, prefixes)) is not None and k not in best]
        if missing:
            scores = self.score([st for _, st in missing])
            for (k, st), _ in sorted(zip(missing, scores), key=lambda t: -t[1]):
                best.setdefault(k, st)
        return [best[k] for k in sorted(best)][:limit]

    # --- learning ---------------------------------------------------------------------------
    def update(self, results: Sequence) -> None:
        """Remember successful programs (they seed later populations) and retrain the model."""
        for r in results:
            if r.ok:
                self.measured.append((r.cost, r.state))
        if self.cost_model is not None and results:
            feats = self.features([r.state for r in results])
            costs = [r.cost if r.ok else math.inf for r in results]
            self.cost_model.update(feats, costs, [self.task.workload_key] * len(results))

    def close(self) -> None:
        """Stop feature workers, if any were started."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def preload(self, records: Sequence[Record]) -> None:
        """Learn from earlier records of this task (a resumed or repeated job)."""
        results = [MeasureResult(st, rec) for rec, st in replay_records(records, self.task.dag)]
        self.update(results)


def sketch_structure(steps: Sequence) -> tuple:
    """What a sketch fixes in its steps, per step: all of it but the lengths of a split and the
    value of a template's pragma, of which only the name before "$" (annotation fills in
    knobs, and adds steps after them); and apart, the split's lengths, None where annotation
    draws one (a sketch may fix some: an AMX tile's rows and columns)."""
    def part(field: str, value):
        if field == "lengths" and value is not None:
            return len(value)
        if field == "pragma" and isinstance(value, str):
            return value.split("$", 1)[0]
        return value

    def lengths(step) -> tuple | None:
        value = getattr(step, "lengths", None)
        return tuple(value) if value is not None else None

    return tuple((repr([part(f, v) for f, v in zip(("tag", *(x.name for x in fields(st))), st.to_json())]),
                  lengths(st))
                 for st in steps)


def _fixed_lengths(prefix: tuple) -> int:
    return sum(length is not None for _, lengths in prefix if lengths is not None for length in lengths)


def _starts_with(structure: tuple, prefix: tuple) -> bool:
    """Whether a program's structure starts with a sketch's: the same steps, and each split
    length the sketch fixed."""
    return len(prefix) <= len(structure) and all(
        rest == own_rest and (lengths is None or all(a is None or a == b for a, b in zip(lengths, own_lengths)))
        for (rest, lengths), (own_rest, own_lengths) in zip(prefix, structure))


def sketch_index(program, prefixes: Sequence[tuple]) -> int | None:
    """The sketch a program was annotated from (the longest structure its steps start with,
    of those the one that fixed the most split lengths), None where none matches (evolution
    changed a structural step)."""
    longest = max((len(p) for p in prefixes), default=0)
    structure = sketch_structure(program.steps[:longest])
    found, rank = None, (-1, -1)
    for k, prefix in enumerate(prefixes):
        if _starts_with(structure, prefix) and (len(prefix), _fixed_lengths(prefix)) > rank:
            found, rank = k, (len(prefix), _fixed_lengths(prefix))
    return found


def tiling_signature(program) -> tuple:
    """The multi-level tiling decision of a program: the lengths of every split that has the
    most levels of its stage (two or more), by stage. Programs that differ only in unrolling,
    parallel granularity or reduction splits share it."""
    return tuple((program.steps[i].stage_id, program.steps[i].lengths) for i in multi_level_splits(program.steps))


def diverse_best(ranked: Sequence, n: int, per_tiling: int, per_inner_tile: int = 0) -> list:
    """Up to n distinct programs from `ranked` (best first), at most `per_tiling` with the same
    tiling and `per_inner_tile` with the same innermost tile shape while others remain.
    Without the cap a batch tends to be 64 near-copies of one tiling the model over-rates, and
    measuring them teaches it little; with it, the batch still follows the model's ranking but
    covers several tilings. 0: no cap."""
    picks: list = []
    keys: set[str] = set()
    per: dict[tuple, int] = {}
    per_inner: dict[tuple, int] = {}
    for capped in ((True, False) if per_tiling or per_inner_tile else (False,)):
        for st in ranked:
            if len(picks) >= n:
                return picks
            if st.key() in keys:
                continue
            if capped:
                sig = tiling_signature(st)
                inner = tuple((stage, lengths[-1]) for stage, lengths in sig)
                if ((per_tiling and per.get(sig, 0) >= per_tiling)
                        or (per_inner_tile and per_inner.get(inner, 0) >= per_inner_tile)):
                    continue
                per[sig] = per.get(sig, 0) + 1
                per_inner[inner] = per_inner.get(inner, 0) + 1
            picks.append(st)
            keys.add(st.key())
    return picks
