"""A quantized cache entry written layer by layer, so that a quantization killed midway resumes where it stopped.

The entry is built in a folder of its own beside the cache (src.common.cache.build_cached, resumable): each rounded
layer's tensors go to layer-NNNNN.safetensors, the calibration windows' hidden states after it to hidden.safetensors,
and then progress.json records how many layers are done and every file's sha256; each file is written whole to a
temporary name and renamed, and progress.json last, so a kill at any moment leaves a record of only whole layers.
A build given that folder again checks the record (the same entry, every file there with its recorded bytes) and
goes on from the first layer it lacks, from the recorded hidden states: the layers before it are not run again, and
what it writes is what an uninterrupted build writes, bit for bit. A record that does not check is said in one line
and the build starts over. The folder becomes the cache only once whole (its files hashed into the cache's manifest):
a partial entry is never read as one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from src.common.locks import atomic_write_text, sha256_file
from src.quant import cache

log = logging.getLogger("quantspec")

PROGRESS = "progress.json"
HIDDEN = "hidden.safetensors"
HEAD_FILE = "head.safetensors"


def layer_file(index: int) -> str:
    return f"layer-{index:05d}.safetensors"


class Partial:
    """A quantization's sink (src.quant.stream.Sink) writing a cache entry into `folder`, resuming what a killed
    build of the same entry (`want`: its source and key) left there."""

    def __init__(self, folder: Path, want: dict):
        self.folder, self.want = folder, want
        self.start, self.hidden = 0, None
        self.files: dict[str, str] = {}  # file -> sha256, the layers done
        why = self._resume()
        if why is not None:
            log.warning("the partial quantization in %s starts over: %s", folder, why)
            for path in folder.iterdir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            self.start, self.hidden, self.files = 0, None, {}

    def _resume(self) -> str | None:
        """Take up what the folder's record vouches for; why it cannot be, or None (a fresh folder: nothing to)."""
        record_path = self.folder / PROGRESS
        if not record_path.is_file():
            return "it holds files but no record of them" if any(self.folder.iterdir()) else None
        try:
            record = json.loads(record_path.read_text())
            done, files = int(record["layers"]), dict(record["files"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            return f"its record does not read ({type(err).__name__})"
        if record.get("want") != json.loads(json.dumps(self.want)):
            return "it was begun for other settings"
        for name, sha in files.items():
            if not (self.folder / name).is_file():
                return f"{name} is missing"
            if sha256_file(self.folder / name) != sha:
                return f"{name} does not match its recorded sha256"
        for stray in self.folder.glob(".*.tmp"):  # a write the kill cut short
            stray.unlink()
        hidden = None
        if HIDDEN in files:
            hidden = list(load_file(str(self.folder / HIDDEN))["hidden"].unbind(0))
        self.start, self.hidden, self.files = done, hidden, files
        if done:
            log.warning("resuming the quantization in %s at layer %d (%d done)", self.folder, done + 1, done)
        return None

    def _write(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        temporary = self.folder / f".{name}.tmp"
        save_file({k: t.contiguous() for k, t in tensors.items()}, str(temporary))
        os.replace(temporary, self.folder / name)
        self.files[name] = sha256_file(self.folder / name)

    def _record(self, done: int) -> None:
        atomic_write_text(
            self.folder / PROGRESS, json.dumps({"want": self.want, "layers": done, "files": self.files}, indent=1)
        )

    def layer(self, index: int, tensors: dict, floats: dict, hidden: list[torch.Tensor] | None) -> None:
        flat = {f"layer/{name}/{k}": t for name, ts in tensors.items() for k, t in ts.items()}
        flat.update({f"float/{name}": t for name, t in floats.items()})
        self._write(layer_file(index), flat)
        if hidden is not None:
            self._write(HIDDEN, {"hidden": torch.stack(hidden)})
        self._record(index + 1)

    def head(self, tensors: dict) -> None:
        self._write(HEAD_FILE, {f"layer/{name}/{k}": t for name, ts in tensors.items() for k, t in ts.items()})

    def weights(self, format_of: dict[str, str], group_size: int | None, info: dict):
        """Finish the entry (its record and hidden states gone, its formats written) and read it back."""
        (self.folder / cache.META).write_text(
            json.dumps({"format": cache.FORMAT, "formats": format_of, "group_size": group_size, "info": info}, indent=2)
        )
        for name in (HIDDEN, PROGRESS):
            (self.folder / name).unlink(missing_ok=True)
        return cache.load(self.folder)
