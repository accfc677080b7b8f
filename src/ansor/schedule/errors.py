"""The error of an illegal schedule step, shared by the steps (malformed records) and the State
primitives (steps that do not apply)."""


class ScheduleError(ValueError):
    """An illegal schedule step; the message names the stage and iterator."""
