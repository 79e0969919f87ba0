"""quantspec's one voice for what a user reads: a line that starts `quantspec: `, said at once (flushed), on
the error stream where it reports a failure."""

from __future__ import annotations

import sys

PREFIX = "quantspec: "


def say(message: str, err: bool = False) -> None:
    print(PREFIX + message, file=sys.stderr if err else sys.stdout, flush=True)
