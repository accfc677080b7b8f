"""TuneOptions: every knob of a tuning job in one typed value, with its default and why.

`ansor.tune(task, trials=200, ...)` builds one from its keywords; the job (`tuning.job.tune`)
reads only this object, so a new option is added here once, with its check, rather than
threaded through every call that passes options on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Sequence

from ansor.measure import TimingPolicy
from ansor.schedule.state import State
from ansor.search.params import SearchParams
from ansor.search.policy import SearchPolicy
from ansor.target import Target
from ansor.tuning.cluster import check_address
from ansor.tuning.scheduler import TaskScheduler

__all__ = ["POLICIES", "TuneOptions"]

POLICIES = ("sketch.xgb", "sketch.random", "basic")


@dataclass(frozen=True)
class TuneOptions:
    """How a tuning job searches, measures and stops.

    Attributes:
        trials: Programs to measure in this job, across all tasks. Programs the database already
            holds are never measured again.
        time_budget: Seconds the job may take: the search stops early enough for the
            leaders' confirmation to end in time too; None for no limit.
        target: When given, the target of every task is set to it.
        timeout: Seconds a kernel may run before it counts as hung (an error record).
        seed: Random seed of the search; None gives a different search each run.
        policy: "sketch.xgb" (evolutionary search guided by the learned cost model),
            "sketch.random" (random programs of the sketches), "basic" (a simple random search),
            or a `SearchPolicy` object (one task only).
        measures_per_round: Programs compiled and measured per round (the batch); a job of at
            most `tuning.job.SMALL_JOB` trials measures in growing rounds of 4, 4, 8, 16 instead.
        timing: How kernels are timed (`ansor.measure.TimingPolicy`); None for the default.
        confirm_best: How many of each task's fastest programs are measured again at the end
            (not counted as trials): the fastest of many noisy measurements is often a lucky one.
        transfer_programs: At most this many measured programs of the database's other
            workloads (same target) train the cost model first; 0 for none.
        scheduler: Which task gets the next round: "round-robin", "gradient" or a
            `TaskScheduler`.
        task_weights: How often each task occurs in the whole model, one weight per task (the
            "gradient" scheduler minimises the sum of weight x latency).
        pretrained: Whether the cost model continues from the package's pretrained model; None
            for the default (yes, unless the environment sets ANSOR_PRETRAINED=0).
        transfer_from: Other targets (`Target` objects or their keys) whose records in the
            database the job starts from: the model learns from them and each task's best
            programs there are measured first.
        first_programs: Programs (`State`s) of the one task, measured before anything the
            search proposes.
        default_first: Each task's untuned default schedule is measured among its first
            programs, so that what the job finds is never slower than building untuned.
        search_params: The evolutionary search's parameters (`SearchParams`) for the
            "sketch.xgb" and "sketch.random" policies; None for the defaults.
        share_programs: In a job of several tasks, each task's rounds first measure the best
            programs of its faster same-structure tasks, fitted to its shapes
            (`tuning.siblings`): a model's layers repeated at other sizes start from what
            their siblings found.
        cluster: Where programs are built and timed: None on this machine; a Ray cluster's
            address ("auto", "ray://HOST:PORT" or "HOST:PORT") to measure on its nodes (the
            search stays here; needs `pip install 'ansor[cluster]'`).
    """

    trials: int = 200
    time_budget: float | None = None
    target: Target | None = None
    timeout: float = 10.0
    seed: int | None = None
    policy: str | SearchPolicy = "sketch.xgb"
    measures_per_round: int = 64
    timing: TimingPolicy | None = None
    confirm_best: int = 4
    transfer_programs: int = 4000
    scheduler: str | TaskScheduler = "round-robin"
    task_weights: Sequence[float] | None = None
    pretrained: bool | None = None
    transfer_from: Target | str | Sequence[Target | str] = ()
    first_programs: Sequence[State] = field(default_factory=tuple)
    default_first: bool = False
    search_params: SearchParams | None = None
    share_programs: bool = True
    cluster: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 0:
            raise ValueError(f"tune: trials must be an integer >= 0, got {self.trials!r}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"tune: time_budget must be positive seconds, got {self.time_budget}")
        if not self.timeout > 0:
            raise ValueError(f"tune: timeout must be positive seconds, got {self.timeout}")
        if self.measures_per_round < 1:
            raise ValueError(f"tune: measures_per_round must be >= 1, got {self.measures_per_round}")
        if self.confirm_best < 0 or self.transfer_programs < 0:
            raise ValueError("tune: confirm_best and transfer_programs must be >= 0")
        if self.cluster is not None:
            check_address(self.cluster)
        if isinstance(self.policy, str) and self.policy not in POLICIES:
            raise ValueError(f"unknown search policy {self.policy!r}; available: {', '.join(POLICIES)}")

    @classmethod
    def from_keywords(cls, base: TuneOptions | None = None, **keywords: Any) -> TuneOptions:
        """`base` (default: the defaults) with `keywords` replaced; an unknown keyword is a
        TypeError naming it and the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise TypeError(f"tune: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return replace(base, **keywords) if base is not None else cls(**keywords)
