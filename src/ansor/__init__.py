"""ansor: an auto-scheduler for tensor programs, after the Ansor paper (OSDI 2020).

Declare a computation with `ansor.te`, wrap it in a `Task`, `tune` it, and `build` the best
program found as a callable `Kernel`.
"""

from ansor import te
from ansor.dag import ComputeDAG
from ansor.database import Database, Record, default_database_path
from ansor.kernel import Kernel, build
from ansor.schedule import ScheduleError, State
from ansor.target import Target
from ansor.task import Task
from ansor.tuner import TuneResult, tune

__version__ = "0.1.0"

__all__ = [
    "te", "ComputeDAG", "Database", "Record", "default_database_path", "Kernel", "build",
    "ScheduleError", "State", "Target", "Task", "TuneResult", "tune", "__version__",
]
