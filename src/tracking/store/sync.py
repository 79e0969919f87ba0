"""Replay journaled results into their tracking stores: python -m src.sync [journal or folder ...] [tracking.uri=<uri>]

A job whose tracking store failed (or was unreachable, with tracking.unreachable=journal) kept every
record in its journal (src.tracking.store.journal). With no arguments this replays the journals listed as pending
under the cache (`$QUANTSPEC_CACHE/journals`, where every job lists its own) and checks the other journals of
their sweeps (found in each sweep's directory: a store that lost a sweep's later jobs may have lost the earlier,
settled ones too); given journals or folders (e.g. a sweep directory), those. Each record reaches the store exactly once, however often this runs;
a store that lost a job's run (deleted, or a server on a fresh backend) gets the job anew. The next job
against the same store does the same by itself.

A journal names the store it was written for; sync replays it there only where that store is one the user
chose: named with `tracking.uri=<uri>` (repeatable), the default store, or one a pending entry of this user's own
jobs names (in their cache). Any other is refused in one line: a file in a folder can name any store, and so can
a Hydra config planted beside it, so neither vouches for one.

A journal leaves the list once the store holds all it can take. One whose store cannot be opened stays
listed while it has records to deliver (exit 1); one with nothing left to deliver is unlisted. Exit 0
when nothing is pending.
"""

from __future__ import annotations

from pathlib import Path

from src.common import envvars
from src.common.paths import cache_root
from src.common.say import say
from src.common.settings import Command, Setting, SettingError
from src.tracking.store import journal, reaping, replay
from src.tracking.store.experiment import Store, probe
from src.tracking.store.names import bound_http_retries, default_uri, first_line, quiet_store_logs


def _registry() -> Path:
    return cache_root() / "journals"


def _journals(args: list[str]) -> list[tuple[Path | None, Path]]:
    if not args:  # the listed journals, and their sweeps' other journals (the store may have lost those too)
        found, lines = journal.with_sweeps(journal.pending(_registry()))
        for line in lines:
            say(line, err=True)
        return found
    found = []
    for arg in map(Path, args):
        if not arg.exists():  # a mistyped folder: not a journal "listed as pending but gone"
            raise SettingError(f"{arg}: no such journal or folder; name a sweep's directory or a {journal.FILE}")
        paths = sorted(arg.rglob(journal.FILE)) if arg.is_dir() else [arg]
        if not paths:
            raise SettingError(f"{arg} holds no {journal.FILE}; name a sweep's directory, a job's folder or a journal")
        for path in paths:
            if not journal.is_journal(path):
                raise SettingError(
                    f"{path} is not a journal (a job's {journal.FILE}: JSON lines of its records); name a sweep's "
                    f"directory or a {journal.FILE}"
                )
        found += [(None, p) for p in paths]
    return found


def _trusted(uri: str, named: set[str], listed: set[str]) -> str | None:
    """Why a journal may be replayed into `uri` (a file can name any store; a sync writes only where the user
    asked), or None. Nothing beside the journal counts: a folder's own config is as plantable as the journal."""
    if uri in named:
        return "named on the command line"
    if uri in listed:
        return "listed by this user's own jobs"
    if uri == default_uri():
        return "the default store"
    return None


COMMAND = Command(
    "python -m src.sync",
    __doc__,
    [Setting("tracking.uri", (), "a store journals may be replayed into (given again for more)", list)],
    takes="paths",
)


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(COMMAND.usage())
        return 0
    try:
        envvars.check()
        cfg, argv = COMMAND.parse(argv)
        journals = _journals(argv) if argv else None  # given paths: each must be there, before anything is replayed
    except (envvars.EnvError, SettingError) as err:
        say(str(err), err=True)
        return 2
    named = set(cfg["tracking.uri"])
    run = _Sync(named, journal.listed_uris(_registry()))
    bound_http_retries()
    quiet_store_logs()
    failed = replayed = 0
    unread = journal.unreadable(_registry()) if not argv else []
    for pointer, why in unread:  # an entry that does not read hides its journal, so it is said, and counts
        say(f"{journal.unreadable_line(pointer, why)}", err=True)
        failed += 1
    for pointer, path in journals if journals is not None else _journals(argv):
        done = run.replay(pointer, path)
        failed += done == "failed"
        replayed += done == "replayed"
    run.reap(bool(unread))
    say(f"sync done: {replayed} journal(s) replayed, {failed} not")
    return 1 if failed else 0


class _Sync:
    """One sync: the stores it opened, and those a journal could not be replayed into."""

    def __init__(self, named: set[str], listed: set[str]):
        self.named, self.listed = named, listed
        self.stores: dict[tuple[str, str], Store] = {}
        self.behind: set[str] = set()  # stores a journal could not be replayed into: their sweeps are not complete

    def replay(self, pointer, path: Path) -> str:
        """One journal into its store, said in one line: 'replayed', 'failed', or '' (nothing to do)."""
        if not path.is_file():
            say(journal.missing_line(path), err=True)
            if pointer is not None:
                pointer.unlink(missing_ok=True)
            return "failed"
        start = journal.start_of(path)
        if not start.get("uri"):
            return ""
        if not isinstance(start["uri"], str) or not _trusted(start["uri"], self.named, self.listed):
            say(
                f"{path}: written for the store {start['uri']!r}, which is neither named here, the "
                f"default store, nor one this user's jobs listed; not replayed (python -m "
                f"src.sync {path.parent} tracking.uri=<that store> replays it there)",
                err=True,
            )
            return "failed"
        key = (start["uri"], start.get("experiment") or "quantspec")
        try:
            if key not in self.stores:
                probe(key[0])
                self.stores[key] = Store(*key)
            sent = replay.replay(self.stores[key], path, pointer)
        except Exception as err:  # noqa: BLE001 - one line per journal, then the next
            return self._unsent(pointer, path, key[0], err)
        if sent is None:
            say(f"{path}: its job is still running; skipped")
            return ""
        say(f"{path}: {sent} record(s) replayed into {key[0]}" if sent else f"{path}: already in the store")
        return "replayed" if sent else ""

    def _unsent(self, pointer, path: Path, uri: str, err: Exception) -> str:
        if journal.unsettled(path) == 0 and pointer is not None:
            pointer.unlink(missing_ok=True)  # delivered before; nothing left to send
            say(
                f"{path}: delivered before; {uri} cannot be opened now "
                f"({first_line(err)}), so it stays unchecked and is unlisted"
            )
            return ""
        say(
            f"{path}: not replayed ({first_line(err)}); fix the store and run python -m src.sync {path.parent} "
            f"tracking.uri={uri} again",
            err=True,
        )
        self.behind.add(uri)
        return "failed"

    def reap(self, unread: bool) -> None:
        """End what killed jobs left RUNNING in each store reached, now that their journals are in."""
        for store in self.stores.values():
            if unread or store.uri in self.behind:  # closing a sweep now would close it without the jobs unsent
                say(
                    f"runs left running in {store.uri} are not closed yet: a journal was not replayed "
                    f"(said above), and its jobs may belong to them; python -m src.sync <its sweep's directory> "
                    f"tracking.uri={store.uri} "
                    f"replays it and closes them"
                )
                continue
            try:
                lines = reaping.reap(store)
            except Exception as err:  # noqa: BLE001
                lines = [f"could not check {store.uri} for runs left running ({type(err).__name__})"]
            for line in lines:
                say(line)
