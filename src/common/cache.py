"""One verified cache, for everything quantspec builds once and reads many times: a converted model, quantized
weights, a reference's figures, another runtime's export.

A cache is a folder holding a manifest (quantspec-cache.json): what it was built for (`want`, e.g. its source and
precision) and every file's size and sha256 as built. It is trusted only while the manifest reads, wants the same,
and every file is there with those bytes, and no file is there that the manifest does not vouch for; otherwise it
is rebuilt, with one line saying why. A build runs under a lock (a second process wanting the same cache waits and
uses it), in a scratch folder beside the cache that replaces it only once whole, so no reader ever sees half a
cache and a killed build leaves only a scratch folder, cleared by the next build (or, for a build that can resume,
given to it). A whole cache is used without the
lock, so a read-only one (a shared cache) serves as it is.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from src.common.locks import file_lock, sha256_file

log = logging.getLogger("quantspec")

MANIFEST = "quantspec-cache.json"
FORMAT = 2  # 2: one manifest for every cache (want, files with bytes and sha256, in folders too)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p != directory / MANIFEST)


def _digests(paths: list[Path]) -> list[str]:
    """Each file's sha256, on as many threads as this process may run (hashlib lets go of the GIL as it hashes: a
    7B's 3.95 GB of quantized weights took 6.4 s on one core of a 2-core Xeon, 0.62 GB/s)."""
    if len(paths) < 2:
        return [sha256_file(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(len(paths), len(os.sched_getaffinity(0)))) as pool:
        return list(pool.map(sha256_file, paths))


def write_manifest(directory: Path, want: dict) -> None:
    """Record what the cache in `directory` was built for and every file's size and sha256."""
    paths = _files(directory)
    files = {
        p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size, "sha256": digest}
        for p, digest in zip(paths, _digests(paths), strict=True)
    }
    (directory / MANIFEST).write_text(json.dumps({"format": FORMAT, "want": want, "files": files}, indent=1))


def damage(directory: Path, want: dict, hashed: bool = True) -> str | None:
    """Why the cache in `directory` cannot be used as it is, or None where it can. `hashed=False` checks all but
    the files' sha256 (a cheap look at a cache that build_cached, reading it, verifies whole)."""
    path = directory / MANIFEST
    if not path.is_file():
        return "no manifest (an interrupted build?)"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return f"its manifest does not read ({type(err).__name__})"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        return "its manifest records no files"
    if manifest.get("format") != FORMAT:
        return f"cache format {manifest.get('format')} != {FORMAT}"
    if manifest.get("want") != json.loads(json.dumps(want)):  # as JSON writes it: a tuple is a list
        return "it was built for other settings or versions"
    unlisted = [p.relative_to(directory).as_posix() for p in _files(directory)]
    unlisted = [name for name in unlisted if name not in manifest["files"]]
    if unlisted:  # a file the manifest does not vouch for (its entry removed) is not trusted either
        return f"{unlisted[0]} is not in its manifest"
    for name, entry in manifest["files"].items():
        file = directory / name
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int):
            return f"its manifest's entry for {name} is not one"
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != entry["bytes"]:
            return f"{name} has {file.stat().st_size} bytes, expected {entry['bytes']}"
    if hashed:
        names = list(manifest["files"])
        for name, digest in zip(names, _digests([directory / n for n in names]), strict=True):
            if digest != manifest["files"][name].get("sha256"):
                return f"{name} does not match its recorded sha256"
    return None


def build_cached(
    directory: Path, build: Callable[[Path], None], want: dict, what: str = "cache", resumable: bool = False
) -> Path:
    """The cache in `directory`, built by `build(out)` where it is missing or damaged: `build` writes the cache's
    files into the folder `out` (and may use `out.parent`, a scratch folder of its own, removed after). A failed
    build (its exception passes through) leaves no cache. `resumable`: `out` is one stable folder beside the cache,
    which a failed or killed build leaves as it was, so the next build of this cache is given it again to resume
    from (its builder checks what it holds: src.quant.shards); else `out` starts empty and a failed build's is
    removed."""
    if directory.is_dir() and damage(directory, want) is None:
        return directory
    with file_lock(directory.with_name(f".{directory.name}.lock"), f"the {what} {directory.name}"):
        why = damage(directory, want) if directory.exists() else None
        if directory.exists() and why is None:  # another process built it while this one waited
            return directory
        if directory.exists():
            log.warning("the %s in %s is rebuilt: %s", what, directory, why)
        # builders hold the lock while they build: any other scratch folder is a killed builder's
        for stale in directory.parent.glob(f".{directory.name}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        work = directory.with_name(
            f".{directory.name}.partial" if resumable else f".{directory.name}.{os.getpid()}.tmp"
        )
        (work / "model").mkdir(parents=True, exist_ok=resumable)
        done = False
        try:
            build(work / "model")
            write_manifest(work / "model", want)
            shutil.rmtree(directory, ignore_errors=True)
            os.replace(work / "model", directory)
            done = True
        finally:
            if done or not resumable:
                shutil.rmtree(work, ignore_errors=True)
    return directory
