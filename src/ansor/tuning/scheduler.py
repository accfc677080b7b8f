"""Task schedulers: which task of a multi-task tuning job gets the next search round.

A scheduler sees each task only through `TaskView` (its measured trials, best cost, weight,
FLOPs, the best cost after each of its rounds and whether its space is exhausted), so it can be
swapped without touching the tuning loop. `RoundRobinScheduler` gives every task the same share;
`GradientScheduler` (Ansor paper, section 6) spends rounds where they shorten the whole model's
latency most, because the tasks of a network differ widely in how much they weigh and in how
much a further round can still gain.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from typing import Callable, Protocol, Sequence


class TaskView(Protocol):
    """What a scheduler may ask of one task's tuner."""

    @property
    def trials(self) -> int: ...

    @property
    def best_cost(self) -> float: ...

    @property
    def weight(self) -> float: ...

    @property
    def exhausted(self) -> bool: ...

    @property
    def flop(self) -> float: ...

    @property
    def rounds(self) -> int: ...

    @property
    def cost_history(self) -> Sequence[float]:
        """The best cost (seconds, inf before any success) after each of the task's rounds."""
        ...


def weighted_latency(tasks: Sequence[TaskView]) -> float:
    """The objective a multi-task job minimises: sum of weight x best cost over the tasks, the
    latency of the whole model when each weight counts a subgraph's occurrences. inf while any
    task has no working program, since the model cannot run without it."""
    if any(math.isinf(t.best_cost) for t in tasks):
        return math.inf
    return sum(t.weight * t.best_cost for t in tasks)


class TaskScheduler(ABC):
    """Picks the task whose round runs next."""

    @abstractmethod
    def next_task(self, tasks: Sequence[TaskView]) -> int | None:
        """Index of the task to tune next; None when no task can go on."""

    def on_round_end(self, index: int, tasks: Sequence[TaskView]) -> None:
        """Told after each round of task `index` (a scheduler with history records it here)."""


class RoundRobinScheduler(TaskScheduler):
    """Every task in turn, skipping those whose search space is exhausted."""

    def __init__(self) -> None:
        self._next = 0

    def next_task(self, tasks: Sequence[TaskView]) -> int | None:
        for offset in range(len(tasks)):
            index = (self._next + offset) % len(tasks)
            if not tasks[index].exhausted:
                self._next = index + 1
                return index
        return None


GOLDEN_RATIO = 1.618  # FLOPs buckets of similarity groups grow by this factor, as in the reference


class GradientScheduler(TaskScheduler):
    """Ansor's gradient-descent task scheduler.

    After one warm-up round per task (every task needs a latency and some history before it can
    be judged), each round goes to the task whose next round is expected to lower
    `weighted_latency` the most. For task i with t_i rounds, best cost g_i, history h_i (best
    cost after each round), weight w_i and FLOPs C_i:

        backward_i = (h_i[t_i-1] - h_i[t_i-1-w]) / w        (w = backward_window; 0 with less history)
        forward_i  = min(g_i - g_i / t_i, beta * C_i / max_{j in group(i)} (C_j / g_j)) - g_i
        grad_i     = w_i * (alpha * backward_i + (1 - alpha) * forward_i)

    and the task with the most negative grad_i runs. w_i is the derivative of the weighted sum
    with respect to g_i. The backward term is what the last rounds actually gained; the forward
    term is an optimistic guess of what the next one can gain: either a 1/t_i share of the
    current cost, or reaching 1/beta of the throughput of the fastest similar task. Similar
    tasks are those with the same `tags` entry and FLOPs within one golden-ratio bucket; without
    tags (or with an empty tag) a task has no group and only the first guess counts.

    A task without a working program yet makes the objective infinite, so such tasks go first,
    the one with the largest w_i / t_i (the limit of the formula as g_i grows). With probability
    `eps` a random live task runs instead, so that a task whose estimate is pessimistic still gets
    a chance; ties are broken at random too. Exhausted tasks, and with `early_stopping` tasks
    whose best cost has not improved for that many rounds, are never picked.
    """

    def __init__(self, alpha: float = 0.2, beta: float = 2.0, backward_window: int = 3,
                 eps: float = 0.05, early_stopping: int | None = None,
                 tags: Sequence[str] | None = None, seed: int | None = None):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"GradientScheduler: alpha must be in [0, 1], got {alpha}")
        if beta <= 0:
            raise ValueError(f"GradientScheduler: beta must be positive, got {beta}")
        if backward_window < 1:
            raise ValueError(f"GradientScheduler: backward_window must be >= 1, got {backward_window}")
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"GradientScheduler: eps must be in [0, 1], got {eps}")
        if early_stopping is not None and early_stopping < 1:
            raise ValueError(f"GradientScheduler: early_stopping must be >= 1 rounds, got {early_stopping}")
        self.alpha = alpha
        self.beta = beta
        self.backward_window = backward_window
        self.eps = eps
        self.early_stopping = early_stopping
        self.tags = list(tags) if tags is not None else None
        self._rng = random.Random(seed)
        self._groups: list[set[int]] | None = None   # task index -> members of its group (itself included)

    # --- which tasks may run -----------------------------------------------------------------
    def stopped(self, task: TaskView) -> bool:
        """Early-stopped: no improvement of the best cost in the last `early_stopping` rounds."""
        if self.early_stopping is None:
            return False
        return _rounds_since_improvement(task.cost_history) >= self.early_stopping

    def _live(self, tasks: Sequence[TaskView]) -> list[int]:
        return [i for i, t in enumerate(tasks) if not t.exhausted and not self.stopped(t)]

    # --- the estimate ------------------------------------------------------------------------
    def gradient(self, index: int, tasks: Sequence[TaskView]) -> float:
        """Estimated change of the objective per round given to task `index` (<= 0; -inf for a
        task without a working program)."""
        task = tasks[index]
        g, t, history = task.best_cost, task.rounds, task.cost_history
        if math.isinf(g):
            return -math.inf
        if t < 1:
            return 0.0  # not warmed up: no estimate yet
        w = self.backward_window
        backward = 0.0
        if len(history) >= t and t - 1 - w >= 0:
            newest, oldest = history[t - 1], history[t - 1 - w]
            if math.isfinite(newest) and math.isfinite(oldest):
                backward = (newest - oldest) / w
        g_next = g - g / t
        best_similar = self._best_similar_throughput(index, tasks)
        if best_similar > 0:
            g_next = min(g_next, self.beta * task.flop / best_similar)
        forward = g_next - g
        return task.weight * (self.alpha * backward + (1 - self.alpha) * forward)

    def _urgency(self, index: int, tasks: Sequence[TaskView]) -> tuple[int, float]:
        """Sort key, smallest runs first: tasks without a working program before the others."""
        task = tasks[index]
        if math.isinf(task.best_cost):
            return (0, -task.weight / max(task.rounds, 1))
        return (1, self.gradient(index, tasks))

    # --- similarity groups -------------------------------------------------------------------
    def _group_of(self, index: int, tasks: Sequence[TaskView]) -> set[int]:
        return self._ensure_groups(tasks)[index]

    def _ensure_groups(self, tasks: Sequence[TaskView]) -> list[set[int]]:
        """Groups are formed once per job, from the tags and the FLOPs, and then only shrink."""
        if self._groups is None or len(self._groups) != len(tasks):
            self._groups = _similarity_groups(tasks, self.tags)
        return self._groups

    def _best_similar_throughput(self, index: int, tasks: Sequence[TaskView]) -> float:
        """Highest FLOP/s reached in task `index`'s group; 0 when it has no group or no results."""
        group = self._group_of(index, tasks)
        if len(group) <= 1:
            return 0.0
        return max(throughput(tasks[j]) for j in group)

    def _leave_group_if_behind(self, index: int, tasks: Sequence[TaskView]) -> None:
        """A task that stays below 1/beta of its group's best throughput after 5 rounds more than
        any other member is not as similar as its tag says: its forward guess would keep
        overrating it, so it leaves the group."""
        group = self._group_of(index, tasks)
        if len(group) <= 1:
            return
        others = [j for j in group if j != index]
        best = max(throughput(tasks[j]) for j in group)
        if (throughput(tasks[index]) < best / self.beta
                and tasks[index].rounds > 5 + max(tasks[j].rounds for j in others)):
            group.discard(index)
            self._ensure_groups(tasks)[index] = {index}

    # --- TaskScheduler -----------------------------------------------------------------------
    def next_task(self, tasks: Sequence[TaskView]) -> int | None:
        self._ensure_groups(tasks)  # a tag list that does not fit the tasks fails at once
        live = self._live(tasks)
        if not live:
            return None
        for i in live:
            if tasks[i].rounds == 0:
                return i  # warm-up, in task order
        if self.eps > 0 and self._rng.random() < self.eps:
            return self._rng.choice(live)
        keys = {i: self._urgency(i, tasks) for i in live}
        best = min(keys.values())
        if len(live) > 1 and all(k == best for k in keys.values()):
            return self._rng.choice(live)
        return min(live, key=lambda i: keys[i])

    def on_round_end(self, index: int, tasks: Sequence[TaskView]) -> None:
        self._leave_group_if_behind(index, tasks)


def throughput(task: TaskView) -> float:
    """FLOP/s of the task's best program; 0 without one."""
    g = task.best_cost
    return task.flop / g if 0 < g < math.inf else 0.0


def _similarity_groups(tasks: Sequence[TaskView], tags: Sequence[str] | None) -> list[set[int]]:
    """For each task the set of tasks sharing its tag and FLOPs bucket (itself at least)."""
    if tags is not None and len(tags) != len(tasks):
        raise ValueError(f"GradientScheduler: {len(tags)} tags for {len(tasks)} tasks")
    by_key: dict[tuple[str, int], set[int]] = {}
    groups: list[set[int]] = []
    for i, task in enumerate(tasks):
        tag = tags[i] if tags is not None else ""
        if not tag:
            groups.append({i})
            continue
        bucket = int(math.log(task.flop + 1, GOLDEN_RATIO))
        members = by_key.setdefault((tag, bucket), set())
        members.add(i)
        groups.append(members)
    return groups


def _rounds_since_improvement(history: Sequence[float]) -> int:
    """Rounds after the last one that lowered the best cost (all of them if none found a
    working program)."""
    best, last = math.inf, -1
    for r, cost in enumerate(history):
        if cost < best:
            best, last = cost, r
    return len(history) - 1 - last


#: Scheduler factories by name; each takes the job's seed (for schedulers that draw at random).
SCHEDULERS: dict[str, Callable[[int | None], TaskScheduler]] = {
    "round-robin": lambda seed: RoundRobinScheduler(),
    "gradient": lambda seed: GradientScheduler(seed=seed),
}


def make_scheduler(scheduler: str | TaskScheduler, seed: int | None = None) -> TaskScheduler:
    """A scheduler object from its name (or the object itself); `seed` makes a named
    scheduler's random choices repeatable."""
    if isinstance(scheduler, TaskScheduler):
        return scheduler
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown task scheduler {scheduler!r}; available: {', '.join(SCHEDULERS)}")
    return SCHEDULERS[scheduler](seed)
