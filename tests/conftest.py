"""The fixtures every room shares (what they are built from: tests/helpers.py). The tests' own environment is set
here, before any test module imports src."""

from __future__ import annotations

import os

import pytest

# Tests never reach a hub: fail fast instead of waiting on timeouts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# No busy round is measured again unless a test asks (busy_reruns=N on its command line): a test's counts of
# jobs and rounds must not follow the host's load. Every process a test starts inherits it.
os.environ.setdefault("QUANTSPEC_BUSY_RERUNS", "0")


@pytest.fixture
def store(tmp_path) -> str:
    """A throwaway MLflow store of the test's own."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
