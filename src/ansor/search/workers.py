"""Worker processes for the search's per-program work: breeding children and extracting their
features. Both are pure Python per program (replay, lowering, features), and one search round
handles thousands of programs (a population of 2048 over several generations), so they are
spread over the cores. Every worker ends with the search process (`ansor.process_lifetime`).

Workers receive the ComputeDAG once; after that only steps travel (pickled Step tuples, a
few hundred bytes each) and features come back. A child is bred and featurized in the same
worker, so it is replayed once; the search process keeps only its steps and key (a Genome).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

import numpy as np

from ansor.costmodel.features import FEATURE_COUNT, program_features
from ansor.process_lifetime import bind_to_parent
from ansor.schedule.state import ScheduleError, State
from ansor.search.annotate_gpu import annotate_program
from ansor.search.collector import collector_paused
from ansor.search.evolution import Genome, as_state, breed_locally, breed_one, chunk_orders, chunk_seed
from ansor.search.params import SearchParams

_WORKER_DAG = None
_WORKER_TARGET = None  # the task's target: features are those of the program as it runs there
_WORKER_FEATURES: dict[str, np.ndarray] = {}  # key -> features of the programs this worker made
_WORKER_FEATURES_LIMIT = 20_000  # about 50 MB of feature rows; the memory is dropped when full


def _init_worker(dag, target, parent_pid: int, creator_is_main_thread: bool) -> None:
    global _WORKER_DAG, _WORKER_TARGET
    bind_to_parent(parent_pid, creator_is_main_thread)
    _WORKER_DAG, _WORKER_TARGET = dag, target
    _WORKER_FEATURES.clear()  # a forked worker must not inherit another task's memory


def _extract_chunk(step_lists: list[tuple]) -> list[np.ndarray]:
    out = []
    with collector_paused():
        for steps in step_lists:
            try:
                state = State.replay(_WORKER_DAG, steps)
            except ScheduleError:
                out.append(np.zeros((0, FEATURE_COUNT), np.float32))
                continue
            out.append(program_features(state, target=_WORKER_TARGET))
    return out


def _packed(state) -> tuple | None:
    """What travels back for a new program: (steps, key, features, reduction block steps);
    None for no program.
    Evolution breeds the same program again from different parents (a few in a hundred
    children): its features are remembered by key rather than lowered again."""
    if state is None:
        return None
    key = state.key()
    feats = _WORKER_FEATURES.get(key)
    if feats is None:
        feats = program_features(state, target=_WORKER_TARGET)
        if len(_WORKER_FEATURES) >= _WORKER_FEATURES_LIMIT:
            _WORKER_FEATURES.clear()
        _WORKER_FEATURES[key] = feats
    return tuple(state.steps), key, feats, state.reduction_block_steps


def _breed_chunk(args: tuple) -> list[tuple | None]:
    """Children of one chunk of orders: `_packed` tuples, or None where the operation
    did not apply."""
    orders, seed, params, cores = args
    rng = random.Random(seed)
    out: list[tuple | None] = []
    with collector_paused():
        for op, parent_steps, parent_blocks, other_steps in orders:
            parent = Genome(_WORKER_DAG, parent_steps, "", parent_blocks)
            other = Genome(_WORKER_DAG, other_steps, "") if other_steps is not None else None
            out.append(_packed(breed_one(op, parent, other, rng, params, cores)))
    return out


def _sample_chunk(args: tuple) -> list[tuple | None]:
    """Randomly annotated programs of the given sketches: `_packed` tuples, or None."""
    sketches, count, seed, params, hardware = args
    rng = random.Random(seed)
    with collector_paused():
        return [_packed(annotate_program(rng.choice(sketches), _WORKER_DAG, rng, params, hardware))
                for _ in range(count)]


def default_worker_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class SearchWorkers:
    """A pool of `n_workers` processes holding the task's DAG (work runs in this process when
    there is one worker or only a little of it)."""

    def __init__(self, dag, n_workers: int | None = None, min_parallel: int = 64, target=None):
        self.dag = dag
        self.target = target  # None: this machine's CPU
        self.n_workers = n_workers or default_worker_count()
        self.min_parallel = min_parallel
        self._pool: ProcessPoolExecutor | None = None

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # fork: no re-import of the user's __main__ (scripts need no main guard); the workers
            # run only Python and numpy, never OpenMP, so forking a threaded parent is safe here
            ctx = multiprocessing.get_context("fork")
            # A fork-context pool forks all its workers in the thread of the first submit, which
            # follows right here; their parent-death signal follows that thread.
            from_main_thread = threading.current_thread() is threading.main_thread()
            self._pool = ProcessPoolExecutor(self.n_workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self.dag, self.target, os.getpid(), from_main_thread))
        return self._pool

    def worth_parallel(self, n: int) -> bool:
        """Whether n programs are enough work to send to the workers."""
        return self.n_workers > 1 and n >= self.min_parallel

    def __call__(self, states: Sequence) -> list[np.ndarray]:
        """Features of many States (or Genomes)."""
        if not self.worth_parallel(len(states)):
            return [program_features(as_state(s), target=self.target) for s in states]
        lists = [tuple(s.steps) for s in states]
        size = -(-len(lists) // (self.n_workers * 4))
        chunks = [lists[i:i + size] for i in range(0, len(lists), size)]
        out: list[np.ndarray] = []
        for part in self._ensure_pool().map(_extract_chunk, chunks):
            out.extend(part)
        return out

    def sample(self, sketches: list, count: int, seed: int, params: SearchParams, hardware,
               memo: dict) -> list:
        """`count` draws of random annotation (Genomes, None where annotation failed), spread
        over the workers; their features go into `memo`. `hardware`: as `annotate_program` takes it."""
        per = -(-count // (self.n_workers * 4))
        jobs = [(sketches, min(per, count - i), chunk_seed(seed, c), params, hardware)
                for c, i in enumerate(range(0, count, per))]
        return self._collect(self._ensure_pool().map(_sample_chunk, jobs), memo)

    def _collect(self, parts, memo: dict) -> list:
        out: list = []
        for part in parts:
            for item in part:
                if item is None:
                    out.append(None)
                    continue
                steps, key, feats, blocks = item
                memo.setdefault(key, feats)
                out.append(Genome(self.dag, steps, key, blocks))
        return out

    def breed(self, orders: list, seed: int, params: SearchParams, memo: dict, cores: int = 1) -> list:
        """Children of `orders` as Genomes (None where an operation did not apply); their
        features go into `memo`, keyed by program key. Same children as `breed_locally`
        (`cores`: the CPU target's, whose idle programs are not children)."""
        if not self.worth_parallel(len(orders)):
            return breed_locally(orders, seed, params, cores)
        jobs = []
        for c, chunk in enumerate(chunk_orders(orders)):
            packed = [(op, tuple(p.steps), p.reduction_block_steps, tuple(o.steps) if o is not None else None)
                      for op, p, o in chunk]
            jobs.append((packed, chunk_seed(seed, c), params, cores))
        return self._collect(self._ensure_pool().map(_breed_chunk, jobs), memo)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
