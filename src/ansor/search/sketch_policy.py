"""SketchPolicy: Ansor's search over sketches filled in by random annotation."""

from __future__ import annotations

import random
from typing import Sequence

from ansor.schedule.state import State
from ansor.search.annotate import annotate
from ansor.search.params import search_params
from ansor.search.policy import SearchPolicy
from ansor.search.sketch import Sketch, SketchContext, SketchRule, generate_sketches
from ansor.task import Task


class SketchPolicy(SearchPolicy):
    """Samples complete programs: a sketch drawn uniformly, then random annotation."""

    def __init__(self, task: Task, seed: int | None = None, params: dict | None = None,
                 custom_rules: Sequence[SketchRule] = ()):
        super().__init__(task, seed)
        self.params = search_params(params)
        self.rng = random.Random(seed)
        ctx = SketchContext(task.target, self.params["cpu_multi_level_tiling_structure"],
                            tuple(self.params["cpu_fusion_levels"]))
        self.sketches: list[Sketch] = generate_sketches(State(task.dag), ctx, custom_rules)
        if not self.sketches:
            raise ValueError(f"no sketch could be derived for task {task.name!r}")

    def sample(self, n: int, exclude: set[str] | None = None) -> list[State]:
        """Up to n distinct complete programs whose key is not in `exclude`."""
        out: list[State] = []
        seen = set(exclude or ())
        tries = 0
        max_tries = n * self.params["max_sample_tries"] + 16
        while len(out) < n and tries < max_tries:
            tries += 1
            sketch = self.rng.choice(self.sketches)
            st = annotate(sketch.steps, self.task.dag, self.rng, self.params, self.task.target.num_cores)
            if st is None:
                continue
            key = st.key()
            if key in seen:
                continue
            seen.add(key)
            out.append(st)
        return out

    def next_batch(self, n: int, measured_keys: set[str]) -> list[State]:
        return self.sample(n, measured_keys)
