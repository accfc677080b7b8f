import os
import signal
import uuid

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


def _with_database(url: str, name: str) -> str:
    """`url` naming the database `name` instead (kept as a URL: libpq's key=value form is none)."""
    scheme, rest = url.split("://", 1)
    authority, _, tail = rest.partition("/")
    query = tail.partition("?")[2]
    return f"{scheme}://{authority}/{name}" + (f"?{query}" if query else "")


@pytest.fixture
def pg_url():
    """A fresh, empty database of this test on the PostgreSQL server .ci/postgres.sh starts
    (ANSOR_TEST_POSTGRES_URL), dropped after; skipped without psycopg or the server."""
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")
    server = os.environ.get("ANSOR_TEST_POSTGRES_URL")
    if not server:
        pytest.skip("no PostgreSQL server: ANSOR_TEST_POSTGRES_URL is not set (.ci/postgres.sh sets it)")
    name = f"ansor_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
