import pytest

from ansor.measure import Builder


@pytest.fixture(scope="session")
def builder(tmp_path_factory) -> Builder:
    """One compile cache for the whole session (identical sources compile once)."""
    return Builder(cache_dir=tmp_path_factory.mktemp("ansor-build"), n_parallel=1)
