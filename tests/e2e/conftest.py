"""The fault tests' shared fixture: a fresh cache of their own."""

import pytest

from tests.support.cli import fresh_cache


@pytest.fixture
def env(tmp_path):
    return {"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))}
