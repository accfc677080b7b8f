"""Worker processes that end with the process that started them.

A worker outliving a killed tuner keeps its cores busy, and every later measurement on the
machine is timed against it; a pool worker blocked on its task queue would wait forever, since
its siblings keep the queue's pipe open. So every worker binds itself to its parent first thing:
on Linux the kernel sends it SIGKILL when the parent dies (`prctl(PR_SET_PDEATHSIG)`), elsewhere
a thread polls the parent id. Workers also ignore Ctrl-C: the terminal sends SIGINT to the whole
process group, and the parent alone decides how to stop (without a traceback from each worker).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

PARENT_POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once in the parent: a compiler's pre-exec hook runs between fork and exec, where
# loading a library could deadlock on a lock another thread held at the fork.
_PRCTL = _load_prctl()


def parent_death_signal_supported() -> bool:
    """Whether this platform can have the kernel signal a worker when its parent dies."""
    return _PRCTL is not None


def _arm_parent_death_signal() -> bool:
    """Ask the kernel for SIGKILL when the parent dies; False where that is not possible."""
    if _PRCTL is None:
        return False
    return _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0


def _exit_when_orphaned(parent_pid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_SECONDS)
        if os.getppid() != parent_pid:
            os._exit(1)


def bind_to_parent(parent_pid: int, creator_is_main_thread: bool = True) -> None:
    """Make this worker process exit when `parent_pid` does, and leave SIGINT to the parent.

    Call it first thing in the worker. The parent-death signal fires when the parent *thread*
    that started the worker exits, not the parent process, so a worker started from another
    thread than the parent's main one (`creator_is_main_thread` False) polls the parent id
    instead, as on platforms without the signal. A parent that died before the signal was armed
    is seen by the id check right after arming it.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a forked worker inherits the parent's handlers; the parent may turn SIGTERM into an exception
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    armed = creator_is_main_thread and _arm_parent_death_signal()
    if os.getppid() != parent_pid:
        os._exit(1)
    if not armed:
        threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True,
                         name="exit-when-orphaned").start()


def child_preexec_bound_to_this_thread() -> Callable[[], None] | None:
    """A `subprocess.Popen(preexec_fn=...)` hook that kills the child (a compiler, say) when the
    calling thread dies; None where the platform has no parent-death signal.

    Only for a child that the calling thread waits for: the signal follows this thread.
    """
    if _PRCTL is None:
        return None
    parent_pid = os.getpid()

    def arm() -> None:
        _arm_parent_death_signal()
        if os.getppid() != parent_pid:
            os._exit(1)

    return arm
