"""This host's locks on a tracking store's shared state (flock: released when the holder dies). A cache
that cannot hold a lock file (read-only) runs without them: the races they close need two writers at once.

- `sweep_lock`: one sweep's parent run is found or created by one process at a time (two syncs, or a sync
  beside the sweep, would otherwise both find none and make a parent each).
- `replay_lock`: a journal's replay (its records, then its sweep's recount) and a reaping of runs left
  running happen one at a time per store. Without it a second sync could end a run, or close a sweep
  with the counts it read, while the first was still sending that sweep's jobs: the sweep then kept a
  count short by the job sent meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from src.common.locks import file_lock
from src.common.paths import cache_root
from src.tracking.store.names import key_of


@contextlib.contextmanager
def _lock(name: str, what: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(file_lock(cache_root() / "locks" / f"{name}.lock", what))
        except OSError:
            pass  # no lock file here (a read-only cache): unlocked
        yield


def sweep_lock(uri: str, sweep_id: str):
    return _lock(f"sweep-{key_of(uri + ' ' + sweep_id)}", "the sweep's parent run")


def replay_lock(uri: str):
    return _lock(f"replay-{key_of(uri)}", f"another replay into {uri}")
