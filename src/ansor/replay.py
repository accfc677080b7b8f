"""Records back into programs: the computation of a stored workload, and the program (State)
a record's steps build on it.

Every reader of records (`ansor show`, `build`, the cost model's data set, a resumed search)
goes through here, so a record either becomes a program or fails with one error type,
`ReplayError`, whose message says why.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from ansor.dag import ComputeDAG
from ansor.records import Record, RecordStore
from ansor.schedule.state import State
from ansor.schedule.steps import steps_from_json


class ReplayError(ValueError):
    """A record that cannot become a program here: its workload cannot be rebuilt, or its steps
    do not apply to it (a record of another ansor version, or a damaged one)."""


def replay(record: Record, dag: ComputeDAG) -> State:
    """The program of a record: its steps parsed and replayed on the workload's DAG."""
    if record.workload_key != dag.workload_key:
        raise ReplayError(f"the record belongs to workload {record.workload_key}, not to {dag.workload_key}")
    try:
        return State.replay(dag, steps_from_json(record.steps))
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # ScheduleError is a ValueError
        raise ReplayError(f"the record's steps do not replay: {exc}") from None


def replay_records(records: Iterable[Record], dag: ComputeDAG) -> Iterator[tuple[Record, State]]:
    """(record, program) for each record that replays; the others are skipped, since a record
    that an older version wrote may no longer apply and the rest are still good."""
    for rec in records:
        try:
            yield rec, replay(rec, dag)
        except ReplayError:
            continue


def dag_from_description(description: dict, workload_key: str | None = None) -> ComputeDAG:
    """The DAG of a stored workload description: from its stored computation, else (older
    descriptions) from the spec of a named workload. With `workload_key`, the rebuilt DAG must
    have that key: a computation that rebuilds differently would misread every step."""
    from ansor.workloads import dag_from_description as dag_from_spec

    if not isinstance(description, dict):
        raise ReplayError("the workload has no description to rebuild it from")
    problems = []
    dag = None
    if "computation" in description:
        try:
            dag = ComputeDAG.from_data(description["computation"])
        except ValueError as exc:
            problems.append(f"its stored computation is unusable ({exc})")
    if dag is None and description.get("spec"):
        try:
            dag = dag_from_spec(description)
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            problems.append(f"its named-workload spec does not rebuild ({exc})")
        else:
            if dag is None:
                problems.append(f"{description['spec'].get('workload')!r} is not a named workload")
    if dag is None:
        if not problems:
            problems.append("its description holds neither the computation nor a named-workload spec")
        raise ReplayError("cannot rebuild the workload: " + "; ".join(problems))
    if workload_key is not None and dag.workload_key != workload_key:
        raise ReplayError(f"the workload rebuilds with key {dag.workload_key}, not the stored {workload_key}")
    return dag


def workload_dag(db: RecordStore, workload_key: str) -> ComputeDAG:
    """The DAG of a workload stored in a database; ReplayError when it cannot be rebuilt."""
    entry = db.workload(workload_key)
    if entry is None:
        raise ReplayError(f"workload {workload_key} is not registered in {db.path}")
    return dag_from_description(entry["description"], workload_key)
