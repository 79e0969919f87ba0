"""A job's local journal: every record it sends to the tracking store, written first to a JSON-lines
file in its own output directory, then acknowledged once the store holds it.

    {"seq": 3, "op": "metrics", "time": ..., "metrics": [[name, value, ms, step], ...]}
    {"ack": 3, "run_id": "..."}                      # the store answered that run ... holds record 3
    {"refused": 4, "run_id": "...", "reason": "..."}  # the store is up and said no to record 4

An ack is written only after the store has taken the record; a refusal is kept as a refusal with its
reason, never as delivered. Records with neither (the store went away, or was never reachable) are
replayed later by `python -m src.sync` or by the next job against the same store: each exactly once,
because a replay appends its own acks. An ack names the run it went to, and a record counts as delivered only to
its job's latest run: a re-send into a store that lost the run (stopped midway) resumes where it stopped. A
replay first asks the store whether it still holds the job's
run: one that lost it (deleted, or a server restarted on a fresh backend) gets the whole job again, its
run created anew with its original times. A pending journal is listed in `<cache>/journals/` until
settled, so the next run finds it wherever the job's output directory was. While a job runs it holds an
flock on its journal, so nothing replays a journal that is still being written.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from src.common.locks import atomic_write_text

log = logging.getLogger(__name__)
FILE = "journal.jsonl"


def now_ms() -> int:
    return int(time.time() * 1000)


class Journal:
    """The writing side: one per job, open and locked for the job's life."""

    def __init__(self, directory: Path, registry: Path, uri: str):
        self.path = directory / FILE
        self.id = uuid.uuid4().hex
        self.uri = uri
        directory.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        _end_torn_line(self._fd, self.path)
        records = _read(self.path)[0]
        self._seq = records[-1]["seq"] + 1 if records else 0
        self._unacked: set[int] = set()
        self._pointer = registry / f"{self.id}.json"
        registry.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self._pointer, json.dumps({"path": str(self.path.resolve()), "uri": uri}))

    def append(self, record: dict) -> int:
        seq = self._seq
        self._write({"seq": seq, **record})
        self._seq += 1
        self._unacked.add(seq)
        return seq

    def ack(self, seq: int, run_id: str | None) -> None:
        self._write({"ack": seq, "run_id": run_id})
        self._unacked.discard(seq)

    def refuse(self, seq: int, run_id: str | None, reason: str) -> None:
        """The store answered and will not take this record: settled, but not delivered."""
        self._write({"refused": seq, "run_id": run_id, "reason": reason[:500]})
        self._unacked.discard(seq)

    def _write(self, line: dict) -> None:
        _append(self._fd, line)

    @property
    def pending(self) -> int:
        return len(self._unacked)

    def close(self) -> None:
        """Unlist the journal once the store holds every record; keep it listed for a replay otherwise."""
        try:
            if not self._unacked:
                self._pointer.unlink(missing_ok=True)
        finally:
            os.close(self._fd)


def _append(fd: int, line: dict) -> None:
    """One JSON line, in one write (O_APPEND: whole lines, whoever else appends)."""
    os.write(fd, (json.dumps(line, ensure_ascii=False) + "\n").encode())


def _end_torn_line(fd: int, path: Path) -> None:
    """A writer killed mid-line leaves no newline: start ours on a line of its own, or the first
    ack would join the torn record and be lost with it."""
    size = path.stat().st_size
    if size:
        with path.open("rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                os.write(fd, b"\n")


def _read(path: Path) -> tuple[list[dict], dict[int, list[str | None]], dict[int, dict[str | None, str]]]:
    """(records, {seq: the run ids it was acknowledged for, in order}, {seq: {run id: the refusal's reason}}). A
    torn line (the writer was killed mid-write) is skipped."""
    records, acks, refused = [], {}, {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "ack" in item:
            acks.setdefault(item["ack"], []).append(item.get("run_id"))
        elif "refused" in item:
            refused.setdefault(item["refused"], {})[item.get("run_id")] = item.get("reason", "")
        elif "seq" in item:
            records.append(item)
    return records, acks, refused


def _targets(records: list[dict], acks: dict[int, list[str | None]]) -> dict[int, str | None]:
    """Each record's delivery target: the run its job's start was last acknowledged for (None: not yet created).

    A record is delivered to that run, not to a store: an ack for the run a store since lost (a server on a
    fresh backend) is no delivery to the run created anew, so a re-send stopped midway resumes where it
    stopped, however its acks interleave with the old delivery's."""
    target, out = None, {}
    for record in records:
        if record["op"] == "start":
            target = (acks.get(record["seq"]) or [None])[-1]
        out[record["seq"]] = target
    return out


def _settled(record: dict, target: str | None, acks: dict, refused: dict) -> bool:
    seq = record["seq"]
    if record["op"] == "start":
        return target is not None
    return target is not None and (target in acks.get(seq, ()) or target in refused.get(seq, {}))


def unsettled(path: Path) -> int:
    """How many of a journal's records its jobs' latest runs hold neither acknowledged nor refused."""
    records, acks, refused = _read(path)
    targets = _targets(records, acks)
    return sum(1 for r in records if not _settled(r, targets[r["seq"]], acks, refused))


def replay(
    path: Path,
    apply: Callable[[dict, str | None], str],
    holds: Callable[[str], bool] = lambda run_id: True,
    refusal: Callable[[Exception], str | None] = lambda err: None,
) -> tuple[int, int] | None:
    """Send a journal's undelivered records through `apply(record, run_id) -> run_id`, acking each for the run it
    went to. `holds(run_id)` says whether the store still has a job's latest run: where it does not, the job's
    records are all sent again (its start creates the run anew, and its acks name the new run). `refusal(err)`
    turns the store's refusal of one record into its reason (the record is marked refused and the replay goes
    on), or None to raise. Returns (sent, refused), or None when another process holds the journal (its job
    still runs)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        _end_torn_line(fd, path)
        records, acks, refused = _read(path)
        targets = _targets(records, acks)
        run_id, sent, said_no = None, 0, 0
        for record in records:  # a rerun into the same directory appends a second job: each start resets
            seq, start = record["seq"], record["op"] == "start"
            if start:
                run_id = targets[seq] if targets[seq] is not None and holds(targets[seq]) else None
                if run_id is not None:
                    continue
            elif run_id in acks.get(seq, ()) or run_id in refused.get(seq, {}):
                continue
            try:
                run_id = apply(record, None if start else run_id)
            except Exception as err:  # noqa: BLE001 - a refusal is recorded and the rest goes on
                reason = refusal(err)
                if reason is None:
                    raise
                _append(fd, {"refused": seq, "run_id": run_id, "reason": reason[:500]})
                said_no += 1
                continue
            _append(fd, {"ack": seq, "run_id": run_id})
            sent += 1
        return sent, said_no
    finally:
        os.close(fd)


def _entries(registry: Path) -> list[tuple[Path, dict]]:
    """(pointer, entry) for each listed entry that reads as an object, oldest first (the rest: unreadable())."""
    found = []
    for pointer in sorted(registry.glob("*.json"), key=lambda p: p.stat().st_mtime) if registry.is_dir() else []:
        try:
            entry = json.loads(pointer.read_text())
        except (ValueError, OSError):  # not JSON, or not UTF-8, or gone
            continue
        if isinstance(entry, dict):
            found.append((pointer, entry))
    return found


def pending(registry: Path, uri: str | None = None) -> list[tuple[Path, Path]]:
    """(pointer, journal) for each listed journal (for `uri`, where given), oldest first."""
    return [
        (pointer, Path(entry["path"]))
        for pointer, entry in _entries(registry)
        if isinstance(entry.get("path"), str) and (uri is None or entry.get("uri") == uri)
    ]


def listed_uris(registry: Path) -> set[str]:
    """The stores named by the pending entries this user's jobs wrote under the cache."""
    return {entry["uri"] for _, entry in _entries(registry) if isinstance(entry.get("uri"), str)}


def with_sweeps(entries: list[tuple[Path, Path]]) -> tuple[list[tuple[Path | None, Path]], list[str]]:
    """The listed journals, then every other journal of the sweeps they belong to, found under each sweep's
    directory (pointer None): a store that lost a sweep's later jobs may have lost its earlier ones too, whose
    journals were settled and unlisted, and a replay asks the store for each job's run. Also a line for each
    sweep whose directory is gone (its unlisted journals cannot be checked)."""
    found: list[tuple[Path | None, Path]] = list(entries)
    seen = {path.absolute() for _, path in entries}
    sweeps: set[str] = set()
    lines = []
    for _, path in entries:
        sweep = start_of(path).get("sweep") if path.is_file() else None
        sweep_id = sweep.get("id") if isinstance(sweep, dict) else None
        if not isinstance(sweep_id, str) or sweep_id in sweeps:
            continue
        sweeps.add(sweep_id)
        if not Path(sweep_id).is_dir():
            lines.append(
                f"sweep {sweep_id}: its directory is gone, so its jobs' journals that are not listed are not "
                f"checked; if it moved, python -m src.sync <its new folder> tracking.uri=<its store> checks them all"
            )
            continue
        for sibling in sorted(Path(sweep_id).rglob(FILE)):
            if sibling.absolute() not in seen:
                seen.add(sibling.absolute())
                found.append((None, sibling))
    return found, lines


def unreadable(registry: Path) -> list[tuple[Path, str]]:
    """(pointer, why) for each listed entry that does not read as one (a writer killed mid-write, a damaged
    disk): pending() passes over these, and whoever syncs must be told, since a journal behind one is not
    replayed from the list."""
    bad = []
    for pointer in sorted(registry.glob("*.json")) if registry.is_dir() else []:
        try:
            entry = json.loads(pointer.read_text())
            why = None if isinstance(entry, dict) and isinstance(entry.get("path"), str) else "not a journal entry"
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            why = f"does not read ({type(err).__name__})"
        except OSError as err:
            why = f"cannot be read ({type(err).__name__})"
        if why:
            bad.append((pointer, why))
    return bad


def unreadable_line(pointer: Path, why: str) -> str:
    return (
        f"the pending-journal entry {pointer} {why}: the journal it named is not replayed from the list; "
        f"run python -m src.sync <that sweep's directory> tracking.uri=<its store> (it finds the journals there), "
        f"then delete "
        f"{pointer.name}"
    )


def is_journal(path: Path) -> bool:
    """Whether `path` reads as a journal: a file whose first line is one of a journal's records (a journal begins
    with its job's start)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            line = f.readline(1 << 20)
        if not line.strip():  # a job killed before its first record: an empty journal, nothing to send
            return path.name == FILE
        first = json.loads(line)
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and isinstance(first.get("seq"), int) and isinstance(first.get("op"), str)


def start_of(path: Path) -> dict:
    """A journal's first start record (which store and experiment it was written for), or {}."""
    return next((r for r in _read(path)[0] if r.get("op") == "start"), {})


def run_ids(path: Path) -> list[str]:
    """The runs a journal's jobs have in the store, as its latest acks say."""
    records, acks, _ = _read(path)
    return [acks[r["seq"]][-1] for r in records if r.get("op") == "start" and (acks.get(r["seq"]) or [None])[-1]]


def missing_line(path: Path) -> str:
    """What to say of a listed journal that is not where its job wrote it."""
    return (
        f"journal {path} is listed as pending but is gone (its directory moved or was deleted); "
        f"if it moved, python -m src.sync <its new folder> tracking.uri=<its store> replays it"
    )
