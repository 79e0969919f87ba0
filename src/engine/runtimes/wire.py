"""The values that cross between a job and its runtime's process (src.engine.runtimes.isolated), as JSON and raw bytes.

No pickle: a message is one JSON text followed by the raw bytes of each tensor it holds, so reading one can
build only the plain values below, never run code. What crosses: None, booleans, numbers, strings, lists,
tuples, dicts with string keys, `pathlib.Path`, CPU tensors (their dtype, shape and bytes) and the few
dataclasses of the engine's contract (`TYPES`). Anything else is a TypeError naming it, raised by the
sender before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from src.engine.config import Sampling
from src.engine.generation import Generation
from src.quality.scoring import WindowScore

TYPES = {cls.__name__: cls for cls in (Generation, Sampling, WindowScore)}


def send(conn: Connection, value) -> None:
    """`value` as one message: its JSON (with how many tensors follow), then each tensor's bytes."""
    blobs: list[bytes] = []
    packed = _pack(value, blobs)  # first: a value that cannot cross writes nothing
    conn.send_bytes(json.dumps({"blobs": len(blobs), "value": packed}).encode())
    for blob in blobs:
        conn.send_bytes(blob)


def check(value) -> None:
    """A TypeError now if `value` could not cross (what `send` would refuse)."""
    _pack(value, [])


def receive(conn: Connection):
    """The value of the next message `send` wrote; EOFError when the other end has closed."""
    head = json.loads(conn.recv_bytes())
    return _unpack(head["value"], [conn.recv_bytes() for _ in range(head["blobs"])])


def _pack(value, blobs: list[bytes]):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_pack(v, blobs) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [_pack(v, blobs) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"a dict with keys that are not strings cannot cross to a runtime's process: {value!r:.80}")
        return {"$dict": {k: _pack(v, blobs) for k, v in value.items()}}
    if isinstance(value, Path):
        return {"$path": str(value)}
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        blobs.append(flat.view(torch.uint8).numpy().tobytes())
        return {"$tensor": len(blobs) - 1, "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    name = type(value).__name__
    if dataclasses.is_dataclass(value) and TYPES.get(name) is type(value):
        return {
            "$type": name,
            "fields": {f.name: _pack(getattr(value, f.name), blobs) for f in dataclasses.fields(value)},
        }
    raise TypeError(
        f"a {type(value).__module__}.{name} cannot cross to a runtime's process (plain values, paths, tensors "
        f"and {', '.join(TYPES)} do)"
    )


def _unpack(value, blobs: list[bytes]):
    if isinstance(value, list):
        return [_unpack(v, blobs) for v in value]
    if not isinstance(value, dict):
        return value
    if "$tuple" in value:
        return tuple(_unpack(v, blobs) for v in value["$tuple"])
    if "$dict" in value:
        return {k: _unpack(v, blobs) for k, v in value["$dict"].items()}
    if "$path" in value:
        return Path(value["$path"])
    if "$tensor" in value:
        data = bytearray(blobs[value["$tensor"]])  # writable: the tensor owns it
        dtype = getattr(torch, value["dtype"])
        flat = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(value["shape"])
    cls = TYPES[value["$type"]]
    return cls(**{k: _unpack(v, blobs) for k, v in value["fields"].items()})
