"""Whether bubblewrap can make a sandbox here (HumanEval runs in one), and the skip that says why not."""

from __future__ import annotations

import functools

import pytest

from src.assembly import schema  # noqa: F401 - the groups' schemas, which every composition is typed by


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run here (scripts/setup installs it as root; a host may still forbid it), or None."""
    from src.tasks import sandbox

    try:
        sandbox.check("bwrap")
    except sandbox.SandboxUnavailable as err:
        return str(err)
    return None


def skip_without_bwrap():
    """The mark that skips a test, saying why, where bubblewrap cannot run."""
    return pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap cannot run here: {bwrap_problem()}")
