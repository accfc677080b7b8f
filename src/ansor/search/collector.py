"""Pausing Python's cyclic garbage collector around the search's allocation-heavy work.

Replaying, lowering and featurizing a program build tens of thousands of short-lived objects
and no reference cycles (they are freed by reference counting the moment they are dropped;
recursive helpers release their closures on return so that this stays true). The collector
still runs a young-generation pass every 700 net allocations and, now and then, a pass over
the whole heap: a sizeable share of a search round spent finding nothing. Pausing it for the
length of a round (or of a worker's chunk) and resuming it afterwards loses nothing: a cycle
made meanwhile is collected at the next pass.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (nested use is fine)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
