"""Schedules: replayable transform steps over a State of loop nests."""

from ansor.schedule.state import Iterator, ScheduleError, Stage, State
from ansor.schedule.steps import Step, step_from_json, steps_from_json

__all__ = ["Iterator", "ScheduleError", "Stage", "State", "Step", "step_from_json", "steps_from_json"]
