"""Measurement on a Ray cluster: the search stays in the tuning job, programs are built and
timed by measuring actors on the cluster's nodes.

`ClusterMeasurer` has the interface of the local `ProgramMeasurer` (`measure`, `close`,
`best_cost`), so the tuner does not know where its programs run. One `ClusterSession` per job
connects to the cluster, asks every node what hardware it has (its *offer*: machine, ISA,
cores) and starts, for each target of the job, one `NodeMeasurer` actor per core set of every
node that can stand for the target: same machine and ISA, at least the target's cores. Each
actor claims its cores with file locks shared by every node of its machine (two nodes on one
machine never time on the same core), pins itself to them, and runs the local measurer there:
the same build, check and timing as a one-machine job, on the node's own compiler.

Faults: every remote call has a deadline; an actor that dies, stops answering or loses its
node takes its programs back to the queue, and they are measured by another actor (a program
lost twice becomes an error record naming both nodes). Results reach the job one by one as
they arrive and are committed there, so nothing measured is lost; the job goes on with the
actors left and fails only when none is. An interrupt kills the actors, which ends their
measurement workers and compilers with them.

Ray (`pip install 'ansor[cluster]'`) is imported here and nowhere else.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import math
import os
import platform
import re
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ansor.backend import backend_for
from ansor.measure import MeasureErrorNo, TimingPolicy
from ansor.records import RECORD_FORMAT_VERSION, Record
from ansor.schedule.state import State
from ansor.schedule.steps import steps_from_json
from ansor.search.policy import MeasureResult
from ansor.target import Target
from ansor.task import Task
from ansor.tuning.measurer import PHASE_COMPILING, PHASE_MEASURING, ProgramMeasurer

__all__ = ["ClusterError", "ClusterMeasurer", "ClusterSession", "NodeOffer", "check_address"]

#: Programs in one remote call: small, so that a lost node takes little work with it and the
#: queue balances between fast and slow nodes; two calls per actor are in flight so that an
#: actor never waits for the driver between them.
PROGRAMS_PER_CALL = 2
CALLS_IN_FLIGHT = 2
#: Seconds a call may take besides its programs' compile and run timeouts (a task's first call
#: on an actor computes the reference outputs).
CALL_SLACK_SECONDS = 60.0
#: Seconds a compile may take on a node (the builders' default).
COMPILE_TIMEOUT = 30.0
#: Seconds for a node to answer what it offers, and for an actor to start.
PROBE_TIMEOUT = 60.0
ACTOR_START_TIMEOUT = 60.0
#: Seconds the actors get to stop their workers before they are killed.
CLOSE_TIMEOUT = 5.0
#: A program taken back from this many lost calls is recorded as an error instead.
MAX_LOSSES = 2
#: Task measurers an actor keeps (each holds a measurement worker and reference outputs).
MEASURERS_PER_ACTOR = 8
#: Where the nodes of one machine take turns for cores (one lock file per core).
CORE_LOCK_DIR = Path(tempfile.gettempdir()) / "ansor-core-locks"

_ADDRESS = re.compile(r"(auto|ray://[^\s/:]+(:\d+)?|[^\s/:]+:\d+)")


class ClusterError(RuntimeError):
    """The cluster cannot measure this job: Ray missing, no cluster at the address, no node
    offering a target, or every node lost."""


def check_address(address: str) -> str:
    """`address` if it names a Ray cluster ("auto", "ray://HOST[:PORT]" or "HOST:PORT"), else
    a ValueError naming the forms."""
    if not isinstance(address, str) or not _ADDRESS.fullmatch(address):
        raise ValueError(f"cluster address {address!r}: give 'auto' (the cluster this machine belongs to), "
                         f"'ray://HOST:PORT' (Ray client) or 'HOST:PORT' (the head node's GCS)")
    return address


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError("measurement on a cluster needs Ray: pip install 'ansor[cluster]'") from None
    return ray


# --- what a node offers ---------------------------------------------------------------------

@dataclass(frozen=True)
class NodeOffer:
    """A node's hardware as the records name it, or why it measures nothing."""

    node_id: str
    name: str           # readable and unique: host name and the start of Ray's node id
    machine: str = ""   # platform.machine(), as in target keys
    isa: str = ""
    cores: int = 0      # Ray's CPUs of the node, at most the cores its processes may use
    problem: str = ""   # why the node offers nothing (no compiler, another ansor, no answer)

    @property
    def prefix(self) -> str:
        return f"cpu-{self.machine}-{self.isa}"

    def stands_for(self, target: Target) -> bool:
        """Whether programs of `target` may be timed here: same machine and ISA, enough cores."""
        return (not self.problem and target.kind == "cpu" and target.num_cores <= self.cores
                and target.key == f"{self.prefix}-{target.num_cores}c")

    def describe(self) -> str:
        if self.problem:
            return f"{self.name}: nothing ({self.problem})"
        return f"{self.name}: {self.prefix} up to {self.cores} core{'s' if self.cores != 1 else ''}"


def node_hardware() -> dict[str, Any]:
    """This node's hardware and software, as a node reports it to the job (runs on the node)."""
    from importlib import metadata

    from ansor.measure import check_compiler

    best = Target.host()
    try:
        check_compiler()
        compiler = ""
    except Exception as err:  # noqa: BLE001 - reported as the node's problem
        compiler = str(err)
    try:
        version = metadata.version("ansor")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"host": socket.gethostname(), "machine": platform.machine() or "unknown", "isa": best.isa,
            "cores": best.num_cores, "ansor": version, "records": RECORD_FORMAT_VERSION, "compiler": compiler}


def _offer(node_id: str, ray_cpus: float, report: dict[str, Any], driver_version: str) -> NodeOffer:
    name = f"{report['host']}-{node_id[:6]}"
    problem = ""
    if report["compiler"]:
        problem = report["compiler"]
    elif report["records"] != RECORD_FORMAT_VERSION or report["ansor"] != driver_version:
        problem = f"ansor {report['ansor']} (records {report['records']}), the job runs {driver_version}"
    elif int(ray_cpus) < 1:
        problem = "no CPU given to Ray"
    return NodeOffer(node_id, name, report["machine"], report["isa"], min(int(ray_cpus), report["cores"]), problem)


# --- the node side --------------------------------------------------------------------------

def claim_cores(count: int) -> tuple[list[int], list[Any]]:
    """`count` cores of this process's CPU set that no other measuring actor of this machine
    holds, as (cores, open lock files); the locks end with the process, however it ends."""
    CORE_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    cores, locks = [], []
    for core in sorted(os.sched_getaffinity(0)):
        lock = open(CORE_LOCK_DIR / f"core-{core}.lock", "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        cores.append(core)
        locks.append(lock)
        if len(cores) == count:
            return cores, locks
    for lock in locks:
        lock.close()
    raise ClusterError(f"no {count} free core{'s' if count != 1 else ''} on this node "
                       f"(another measurement holds them)")


class NodeMeasurer:
    """A Ray actor: one core set of one node measuring programs of one target.

    It pins itself (and so its compilers and measurement workers) to the cores it claimed, and
    measures with the local `ProgramMeasurer`, one per task (the last few kept)."""

    def __init__(self, node: str, target: Target, timeout: float, timing: TimingPolicy | None):
        self.node = node
        self.target = target
        self.timeout = timeout
        self.timing = timing
        self.cores: list[int] = []
        self._locks: list[Any] = []
        self._measurers: collections.OrderedDict[str, ProgramMeasurer] = collections.OrderedDict()
        self._builder = None

    def start(self) -> dict[str, Any]:
        """Claim the cores; {"pid", "cores"}, or {"problem"} when this node cannot measure."""
        try:
            here = Target.host(isa=self.target.isa, num_cores=self.target.num_cores)
            if here.key != self.target.key:
                return {"problem": f"this node is {here.key}, not {self.target.key}"}
            self.cores, self._locks = claim_cores(self.target.num_cores)
        except (ClusterError, ValueError) as err:
            return {"problem": str(err)}
        self._pin()
        self._builder = backend_for(self.target).builder(self.target, n_parallel=len(self.cores))
        return {"pid": os.getpid(), "cores": self.cores}

    def _pin(self) -> None:
        # affinity belongs to a thread: set it on the one that starts compilers and workers
        os.sched_setaffinity(0, self.cores)

    def _measurer(self, task_id: str, box: list) -> ProgramMeasurer:
        measurer = self._measurers.get(task_id)
        if measurer is None:
            task = _ray().get(box[0])
            measurer = ProgramMeasurer(task, builder=self._builder, timeout=self.timeout, timing=self.timing)
            self._measurers[task_id] = measurer
            while len(self._measurers) > MEASURERS_PER_ACTOR:
                self._measurers.popitem(last=False)[1].close()
        self._measurers.move_to_end(task_id)
        return measurer

    def measure(self, task_id: str, box: list, steps: Sequence[list], best_cost: float,
                full_timing: bool = False) -> dict[str, Any]:
        """Measure programs (their steps) of a task; each result as (costs, error_no, message,
        seconds, timestamp), and the processes that did it (for whoever checks they end).
        `full_timing` as in `ProgramMeasurer.measure`."""
        self._pin()
        measurer = self._measurer(task_id, box)
        measurer.best_cost = min(measurer.best_cost, best_cost)
        states, out = [], [None] * len(steps)
        for i, program in enumerate(steps):
            try:
                states.append((i, State.replay(measurer.task.dag, steps_from_json(program))))
            except (ValueError, TypeError, IndexError, KeyError) as err:
                out[i] = ((), int(MeasureErrorNo.INSTANTIATION_ERROR), f"{self.node}: steps do not replay: {err}",
                          0.0, time.time())
        results = measurer.measure([s for _, s in states], full_timing=full_timing) if states else []
        for (i, _), result in zip(states, results):
            r = result.record
            out[i] = (r.costs, r.error_no, r.error_msg, r.all_cost, r.timestamp)
        worker = measurer.runner.worker_pid if hasattr(measurer.runner, "worker_pid") else None
        return {"results": out, "pids": [os.getpid()] + ([worker] if worker else [])}

    def close(self) -> None:
        """Stop every measurement worker and free the cores."""
        while self._measurers:
            self._measurers.popitem()[1].close()
        for lock in self._locks:
            lock.close()
        self._locks = []


# --- the driver side ------------------------------------------------------------------------

@dataclass
class _Call:
    ref: Any
    indices: list[int]
    budget: float              # seconds it may take once it runs
    deadline: float = math.inf  # set when it is the actor's oldest call


@dataclass
class _Actor:
    handle: Any
    node: NodeOffer
    pids: list[int]
    calls: collections.deque = None  # of _Call, oldest first

    def __post_init__(self) -> None:
        self.calls = collections.deque()


class _TargetPool:
    """The measuring actors of one target, and what was lost of them."""

    def __init__(self, session: ClusterSession, target: Target):
        self.session = session
        self.target = target
        self.actors: list[_Actor] = []
        self.lost: list[str] = []   # "node: why", for the messages
        self._start()

    def _start(self) -> None:
        ray = self.session.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        offers = [o for o in self.session.offers if o.stands_for(self.target)]
        if not offers:
            raise ClusterError(f"no node of the cluster offers target {self.target.key}; the nodes offer: "
                               + "; ".join(o.describe() for o in self.session.offers))
        remote = ray.remote(NodeMeasurer)
        starting = []
        for offer in offers:
            for _ in range(offer.cores // self.target.num_cores):
                handle = remote.options(
                    num_cpus=self.target.num_cores, max_restarts=0, max_task_retries=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(offer.node_id, soft=False),
                ).remote(offer.name, self.target, self.session.timeout, self.session.timing)
                starting.append((handle, offer, handle.start.remote()))
        ready, _ = ray.wait([ref for *_, ref in starting], num_returns=len(starting), timeout=ACTOR_START_TIMEOUT)
        ready = set(ready)
        problems = []
        for handle, offer, ref in starting:
            answer = {"problem": f"did not start within {ACTOR_START_TIMEOUT:g} s"}
            if ref in ready:
                try:
                    answer = ray.get(ref)
                except ray.exceptions.RayError as err:
                    answer = {"problem": _short(err)}
            if "problem" in answer:
                problems.append(f"{offer.name}: {answer['problem']}")
                ray.kill(handle, no_restart=True)
            else:
                self.actors.append(_Actor(handle, offer, [answer["pid"]]))
        if not self.actors:
            raise ClusterError(f"no node could start measuring {self.target.key}: " + "; ".join(problems))
        self.lost += problems

    def lose(self, actor: _Actor, why: str) -> list[_Call]:
        """Drop a dead or silent actor (killed, so it stops for sure); its calls, to retry."""
        if actor in self.actors:
            self.actors.remove(actor)
            self.lost.append(f"{actor.node.name}: {why}")
            self.session.lost.append(self.lost[-1])
            try:
                self.session.ray.kill(actor.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone with its node
                pass
        calls = list(actor.calls)
        actor.calls.clear()
        return calls

    def close(self) -> None:
        ray = self.session.ray
        refs = []
        for actor in self.actors:
            try:
                refs.append(actor.handle.close.remote())
            except Exception:  # noqa: BLE001
                pass
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT)
        for actor in self.actors:
            try:
                ray.kill(actor.handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []

    def kill(self) -> None:
        """Stop every actor now (an interrupt): their workers and compilers die with them."""
        for actor in self.actors:
            try:
                self.session.ray.kill(actor.handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []


def _short(err: BaseException) -> str:
    """The last meaningful line of a Ray error (they carry whole remote tracebacks)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[-1] if lines else type(err).__name__)[:300]


class ClusterSession:
    """One job's connection to a Ray cluster: the nodes' offers and a pool of measuring actors
    per target. `close()` stops the actors and disconnects (when this session connected)."""

    def __init__(self, address: str, timeout: float = 10.0, timing: TimingPolicy | None = None):
        self.address = check_address(address)
        self.timeout = timeout
        self.timing = timing
        self.ray = ray = _ray()
        self._connected = False
        self._pools: dict[str, _TargetPool] = {}
        self.node_pids: dict[str, set[int]] = collections.defaultdict(set)  # node name -> processes seen
        self.lost: list[str] = []  # "node: why" of each actor lost during the job
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=False,
                         configure_logging=False)
            except Exception as err:  # noqa: BLE001 - ConnectionError and Ray's own kinds
                raise ClusterError(f"cannot reach a Ray cluster at {self.address}: {_short(err)}") from None
            self._connected = True
        try:
            self.offers = self._probe()
        except BaseException:
            self.close()
            raise

    def _probe(self) -> list[NodeOffer]:
        from importlib import metadata

        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self.ray
        try:
            version = metadata.version("ansor")
        except metadata.PackageNotFoundError:
            version = "unknown"
        probe = ray.remote(node_hardware)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        refs = [probe.options(num_cpus=0, max_retries=0,
                              scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
                for n in nodes]
        ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT)
        offers = []
        for node, ref in zip(nodes, refs):
            node_id, cpus = node["NodeID"], node.get("Resources", {}).get("CPU", 0.0)
            try:
                report = ray.get(ref, timeout=0)
            except Exception as err:  # noqa: BLE001 - timed out or failed: the node offers nothing
                offers.append(NodeOffer(node_id, f"{node.get('NodeManagerHostname', '?')}-{node_id[:6]}",
                                        problem=f"no answer ({_short(err)})"))
                continue
            offers.append(_offer(node_id, cpus, report, version))
        return offers

    def pool(self, target: Target) -> _TargetPool:
        """The measuring actors of `target`, started at the first call: a ClusterError at once
        when no node offers it."""
        if target.kind != "cpu":
            raise ClusterError(f"measurement on a cluster serves CPU targets; {target.key} is measured locally "
                               f"(leave out the cluster)")
        pool = self._pools.get(target.key)
        if pool is None:
            pool = self._pools[target.key] = _TargetPool(self, target)
            for actor in pool.actors:
                self.node_pids[actor.node.name].update(actor.pids)
        return pool

    def measurer(self, task: Task, best_cost: float = math.inf) -> ClusterMeasurer:
        return ClusterMeasurer(task, self, best_cost)

    def kill(self) -> None:
        """Stop all remote work now (an interrupt)."""
        for pool in self._pools.values():
            pool.kill()

    def close(self) -> None:
        """Stop the actors and disconnect; runs after an interrupt too."""
        try:
            for pool in self._pools.values():
                pool.close()
        finally:
            self._pools = {}
            if self._connected:
                self._connected = False
                self.ray.shutdown()


class ClusterMeasurer:
    """Measures a task's programs on the cluster's actors for its target, with the interface of
    `ProgramMeasurer`: results handed on one by one, in any order, and returned in order."""

    def __init__(self, task: Task, session: ClusterSession, best_cost: float = math.inf):
        self.task = task
        self.session = session
        self.best_cost = best_cost
        self.last_batch_seconds = 0.0
        self.pool = session.pool(task.target)  # fails at once when no node offers the target
        self._task_id = f"{task.workload_key}/{task.target.key}/{id(self)}"
        self._box = [session.ray.put(task)]  # in a list: Ray hands the actor the reference, not a copy per call

    def measure(self, states: Sequence[State], on_result: Callable[[MeasureResult], None] | None = None,
                on_phase: Callable[[str], None] | None = None,
                deadline: float | None = None, full_timing: bool = False) -> list[MeasureResult]:
        """Measure `states` on the cluster; never raises for a bad program. Past `deadline` no
        further call starts (calls under way finish). Raises ClusterError when no actor is left.
        `full_timing` as in `ProgramMeasurer.measure`."""
        start = time.time()
        if on_phase is not None:
            on_phase(PHASE_COMPILING)
        done: dict[int, MeasureResult] = {}
        try:
            self._dispatch(states, done, on_result, on_phase, deadline, full_timing)
        except BaseException:
            self.session.kill()  # an interrupt: the remote work stops with it
            raise
        self.last_batch_seconds = time.time() - start
        return [done[i] for i in sorted(done)]

    def _dispatch(self, states, done, on_result, on_phase, deadline, full_timing) -> None:
        ray, pool = self.session.ray, self.pool
        queue = collections.deque(range(len(states)))
        losses: dict[int, list[str]] = collections.defaultdict(list)
        per_program = self._budget_per_program()
        measuring = False

        def finish(index: int, record: Record) -> None:
            nonlocal measuring
            result = MeasureResult(states[index], record)
            if record.error_no == 0 and record.costs:
                self.best_cost = min(self.best_cost, record.median_cost)
            done[index] = result
            if on_phase is not None and not measuring:
                measuring = True
                on_phase(PHASE_MEASURING)
            if on_result is not None:
                on_result(result)

        def take_back(actor: _Actor, why: str) -> None:
            for call in pool.lose(actor, why):
                for index in call.indices:
                    losses[index].append(f"{actor.node.name} ({why})")
                    if len(losses[index]) >= MAX_LOSSES:
                        finish(index, self._lost_record(states[index], losses[index]))
                    else:
                        queue.appendleft(index)

        while queue or any(a.calls for a in pool.actors):
            open_for_calls = deadline is None or time.time() < deadline
            if not open_for_calls:
                queue.clear()
            for depth in range(CALLS_IN_FLIGHT):  # every actor's first call before any actor's second
                for actor in pool.actors:
                    if not queue or len(actor.calls) > depth:
                        continue
                    indices = [queue.popleft() for _ in range(min(PROGRAMS_PER_CALL, len(queue)))]
                    steps = [states[i].steps_json() for i in indices]
                    ref = actor.handle.measure.remote(self._task_id, self._box, steps, self.best_cost, full_timing)
                    call = _Call(ref, indices, CALL_SLACK_SECONDS + per_program * len(indices))
                    if not actor.calls:
                        call.deadline = time.time() + call.budget
                    actor.calls.append(call)
            if not pool.actors:
                if queue:
                    raise ClusterError(f"no node is left to measure {self.task.target.key}: " + "; ".join(pool.lost))
                break
            refs = {actor.calls[0].ref: actor for actor in pool.actors if actor.calls}
            if not refs:
                continue
            wait = max(0.05, min(1.0, min(a.calls[0].deadline for a in refs.values()) - time.time()))
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=wait)
            for ref in ready:
                actor = refs[ref]
                call = actor.calls.popleft()
                try:
                    answer = ray.get(ref)
                except ray.exceptions.RayTaskError as err:  # the node's code failed: the programs are errors
                    for index in call.indices:
                        finish(index, self._error_record(states[index], MeasureErrorNo.UNKNOWN_ERROR,
                                                         f"{actor.node.name}: {_short(err)}", actor.node.name))
                    answer = None
                except ray.exceptions.RayError as err:  # the actor or its node is gone
                    actor.calls.appendleft(call)
                    take_back(actor, _short(err))
                    continue
                if answer is not None:
                    self.session.node_pids[actor.node.name].update(answer["pids"])
                    for index, (costs, error_no, message, seconds, stamp) in zip(call.indices, answer["results"]):
                        finish(index, Record(
                            workload_key=self.task.workload_key, target_key=self.task.target.key,
                            steps=states[index].steps_json(), state_key=states[index].key(), costs=tuple(costs),
                            error_no=int(error_no), error_msg=message, all_cost=seconds, timestamp=stamp,
                            node=actor.node.name))
                if actor.calls:
                    actor.calls[0].deadline = time.time() + actor.calls[0].budget
            now = time.time()
            for actor in list(pool.actors):
                if actor.calls and now > actor.calls[0].deadline:
                    take_back(actor, f"no answer within {actor.calls[0].budget:g} s")

    def _budget_per_program(self) -> float:
        """Seconds one program may take on an actor: its compile and run timeouts and a margin."""
        return COMPILE_TIMEOUT + self.session.timeout + 5.0

    def _error_record(self, state: State, error_no: MeasureErrorNo, message: str, node: str) -> Record:
        return Record(workload_key=self.task.workload_key, target_key=self.task.target.key,
                      steps=state.steps_json(), state_key=state.key(), costs=(), error_no=int(error_no),
                      error_msg=message[:2000], timestamp=time.time(), node=node)

    def _lost_record(self, state: State, losses: list[str]) -> Record:
        nodes = ", ".join(dict.fromkeys(l.split(" ", 1)[0] for l in losses))
        return self._error_record(state, MeasureErrorNo.RUNTIME_DEVICE,
                                  "lost with its node, twice: " + "; then ".join(losses), nodes)

    def close(self) -> None:
        """Nothing of its own: the session's actors serve every task of the job."""
