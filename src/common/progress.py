"""Progress bars for long work that stay quiet where nobody watches (CI, logs, pipes)."""

from __future__ import annotations

import os
import sys

from tqdm.auto import tqdm


def watched() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def progress(iterable, desc: str, total: int | None = None):
    return tqdm(iterable, desc=desc, total=total, disable=not watched(), leave=False, dynamic_ncols=True)
