"""Replay journaled results into their tracking stores: python -m src.tracking.sync [journal or folder ...] [tracking_uri=<uri>]

A job whose tracking store failed (or was unreachable, with tracking.unreachable=journal) kept every
record in its journal (src.tracking.journal). With no arguments this replays the journals listed as pending
under the cache (`$QUANTSPEC_CACHE/journals`, where every job lists its own) and checks the other journals of
their sweeps (found in each sweep's directory: a store that lost a sweep's later jobs may have lost the earlier,
settled ones too); given journals or folders (e.g. a sweep directory), those. Each record reaches the store exactly once, however often this runs;
a store that lost a job's run (deleted, or a server on a fresh backend) gets the job anew. The next job
against the same store does the same by itself.

A journal names the store it was written for; sync replays it there only where that store is one the user
chose: named with `tracking_uri=<uri>` (repeatable), the default store, one a pending entry of this user's own
jobs names, or the one its job's Hydra config (`.hydra/config.yaml` beside it) names. Any other is refused in
one line (a file in a folder can name any store).

A journal leaves the list once the store holds all it can take. One whose store cannot be opened stays
listed while it has records to deliver (exit 1); one with nothing left to deliver is unlisted. Exit 0
when nothing is pending.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from src.common import envvars
from src.common.paths import cache_root
from src.tracking import (
    Store,
    bound_http_retries,
    default_uri,
    first_line,
    journal,
    probe,
    quiet_store_logs,
    reaping,
    replay,
)


def _registry() -> Path:
    return cache_root() / "journals"


def _journals(args: list[str]) -> list[tuple[Path | None, Path]]:
    if not args:  # the listed journals, and their sweeps' other journals (the store may have lost those too)
        found, lines = journal.with_sweeps(journal.pending(_registry()))
        for line in lines:
            print(f"quantspec: {line}", file=sys.stderr)
        return found
    found = []
    for arg in map(Path, args):
        paths = sorted(arg.rglob(journal.FILE)) if arg.is_dir() else [arg]
        found += [(None, p) for p in paths]
    return found


def _config_uri(path: Path) -> str | None:
    """The store the journal's job was configured with (its Hydra config beside it), or None."""
    config = path.parent / ".hydra" / "config.yaml"
    try:
        tracking = OmegaConf.load(config).get("tracking") if config.is_file() else None
        uri = OmegaConf.select(tracking, "uri") if tracking is not None else None
    except Exception:  # noqa: BLE001 - a damaged or odd config vouches for nothing
        return None
    return uri if isinstance(uri, str) else default_uri() if tracking is not None else None


def _trusted(uri: str, path: Path, named: set[str], listed: set[str]) -> str | None:
    """Why this journal may be replayed into `uri` (a file can name any store; a sync writes only where the
    user asked), or None."""
    if uri in named:
        return "named on the command line"
    if uri in listed:
        return "listed by this user's own jobs"
    if uri == default_uri():
        return "the default store"
    if uri == _config_uri(path):
        return "its job's config"
    return None


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__.strip())
        return 0
    try:
        envvars.check()
    except envvars.EnvError as err:
        print(f"quantspec: {err}", file=sys.stderr)
        return 2
    named = {a.removeprefix("tracking_uri=") for a in argv if a.startswith("tracking_uri=")}
    argv = [a for a in argv if not a.startswith("tracking_uri=")]
    listed = journal.listed_uris(_registry())
    bound_http_retries()
    quiet_store_logs()
    stores: dict[tuple[str, str], Store] = {}
    failed = replayed = 0
    unread = journal.unreadable(_registry()) if not argv else []
    for pointer, why in unread:  # an entry that does not read hides its journal, so it is said, and counts
        print(f"quantspec: {journal.unreadable_line(pointer, why)}", file=sys.stderr)
        failed += 1
    behind: set[str] = set()  # stores a journal could not be replayed into: their sweeps are not complete
    for pointer, path in _journals(argv):
        if not path.is_file():
            print(f"quantspec: {journal.missing_line(path)}", file=sys.stderr)
            if pointer is not None:
                pointer.unlink(missing_ok=True)
            failed += 1
            continue
        start = journal.start_of(path)
        if not start.get("uri"):
            continue
        if not isinstance(start["uri"], str) or not _trusted(start["uri"], path, named, listed):
            print(
                f"quantspec: {path}: written for the store {start['uri']!r}, which is neither named here, the "
                f"default store, one this user's jobs listed, nor its job's config's; not replayed (python -m "
                f"src.tracking.sync {path.parent} tracking_uri=<that store> replays it there)",
                file=sys.stderr,
            )
            failed += 1
            continue
        key = (start["uri"], start.get("experiment") or "quantspec")
        try:
            if key not in stores:
                probe(key[0])
                stores[key] = Store(*key)
            sent = replay.replay(stores[key], path, pointer)
        except Exception as err:  # noqa: BLE001 - one line per journal, then the next
            if journal.unsettled(path) == 0 and pointer is not None:
                pointer.unlink(missing_ok=True)  # delivered before; nothing left to send
                print(
                    f"quantspec: {path}: delivered before; {key[0]} cannot be opened now "
                    f"({first_line(err)}), so it stays unchecked and is unlisted"
                )
                continue
            print(
                f"quantspec: {path}: not replayed ({first_line(err)}); "
                f"fix the store and run python -m src.tracking.sync again",
                file=sys.stderr,
            )
            failed += 1
            behind.add(key[0])
            continue
        if sent is None:
            print(f"quantspec: {path}: its job is still running; skipped")
            continue
        replayed += bool(sent)
        print(
            f"quantspec: {path}: {sent} record(s) replayed into {key[0]}"
            if sent
            else f"quantspec: {path}: already in the store"
        )
    for store in stores.values():  # what a killed job left RUNNING there, now that its journal is in
        if unread or store.uri in behind:  # closing a sweep now would close it without the jobs still unsent
            print(
                f"quantspec: runs left running in {store.uri} are not closed yet: a journal was not replayed "
                f"(said above), and its jobs may belong to them; python -m src.tracking.sync <its sweep's directory> "
                f"replays it and closes them"
            )
            continue
        try:
            lines = reaping.reap(store)
        except Exception as err:  # noqa: BLE001
            lines = [f"could not check {store.uri} for runs left running ({type(err).__name__})"]
        for line in lines:
            print(f"quantspec: {line}")
    print(f"quantspec: sync done: {replayed} journal(s) replayed, {failed} not")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
