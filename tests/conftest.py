import os
import signal

import pytest

# Tuning tests run their first rounds on random samples (fast), as without a shipped model; a
# model-guided first round is a full evolutionary search, seconds per test. The pretrained paths
# are tested with the switch on (tests/test_costmodel.py, test_tune_end_to_end.py).
os.environ.setdefault("ANSOR_PRETRAINED", "0")
# A model built from an empty database keeps its default schedules unless a test asks for the
# quick search (each would otherwise spend up to two minutes choosing programs).
os.environ.setdefault("ANSOR_MODEL_QUICK_SECONDS", "0")

# A suite started with SIGINT ignored (a background job of a shell without job control) passes
# that on to every process it starts, and the tests of Ctrl-C would find it ignored there: a
# handler instead of SIG_IGN here gives the children the default disposition back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from ansor.measure import Builder


@pytest.fixture(scope="session")
def builder(tmp_path_factory) -> Builder:
    """One compile cache for the whole session (identical sources compile once)."""
    return Builder(cache_dir=tmp_path_factory.mktemp("ansor-build"), n_parallel=1)
