"""quantspec's one voice for what a user reads: a line that starts `quantspec: `, said at once (flushed), on
the error stream where it reports a failure."""

from __future__ import annotations

import sys

PREFIX = "quantspec: "


def say(message: str, err: bool = False) -> None:
    print(PREFIX + message, file=sys.stderr if err else sys.stdout, flush=True)


def message_line(err: BaseException, empty: str = "no message") -> str:
    """An exception's message, its first line only (`empty` where it has none): what a one-line reason quotes
    of it."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else empty
