"""Feature extraction in worker processes: the search's most expensive step, spread over cores.

Workers receive the ComputeDAG once and then only step lists (small JSON), replay them, lower
the programs and extract features; the search process keeps evolving meanwhile.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

import numpy as np

_WORKER_DAG = None


def _init_worker(dag) -> None:
    global _WORKER_DAG
    _WORKER_DAG = dag


def _extract_chunk(step_lists: list[list]) -> list[np.ndarray]:
    from ansor.costmodel.features import FEATURE_COUNT, program_features
    from ansor.schedule.state import ScheduleError, State
    from ansor.schedule.steps import steps_from_json

    out = []
    for steps in step_lists:
        try:
            state = State.replay(_WORKER_DAG, steps_from_json(steps))
        except ScheduleError:
            out.append(np.zeros((0, FEATURE_COUNT), np.float32))
            continue
        out.append(program_features(state))
    return out


class ParallelFeatures:
    """Callable: features of many States, computed by `n_workers` processes (in this process
    when there is one core or few states)."""

    def __init__(self, dag, n_workers: int | None = None, min_parallel: int = 64):
        self.dag = dag
        self.n_workers = n_workers or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                           else (os.cpu_count() or 1))
        self.min_parallel = min_parallel
        self._pool: ProcessPoolExecutor | None = None

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # fork: no re-import of the user's __main__ (scripts need no main guard); the workers
            # run only Python and numpy, never OpenMP, so forking a threaded parent is safe here
            ctx = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(self.n_workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self.dag,))
        return self._pool

    def __call__(self, states: Sequence) -> list[np.ndarray]:
        from ansor.costmodel.features import program_features

        if self.n_workers <= 1 or len(states) < self.min_parallel:
            return [program_features(s) for s in states]
        lists = [s.steps_json() for s in states]
        n = self.n_workers * 4
        size = -(-len(lists) // n)
        chunks = [lists[i:i + size] for i in range(0, len(lists), size)]
        out: list[np.ndarray] = []
        for part in self._ensure_pool().map(_extract_chunk, chunks):
            out.extend(part)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
