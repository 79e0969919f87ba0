"""Quantization's inputs in tests: calibration windows of a tiny model, a method's spec with conf's defaults."""

from __future__ import annotations

from omegaconf import OmegaConf

from src.assembly import schema  # noqa: F401 - the groups' schemas, which every composition is typed by
from tests.support.cli import CONF


def calib(tok, n: int = 4, length: int = 64):
    """Calibration batches for a tiny model's quantization: code, as the default corpus is."""
    from src.quant import calibrate

    text = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n" * 40
    return calibrate.calibration_ids(tok, text, n, length)


def quant_spec(method: str, format: str, **fields):
    """The spec of `method` (src.quant.methods.METHODS) with conf/precision/_fields.yaml's defaults (the one
    place they live) under `fields`."""
    import dataclasses

    from src.quant.methods import METHODS

    cls = METHODS[method]
    defaults = OmegaConf.to_container(OmegaConf.load(CONF / "precision" / "_fields.yaml"))
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in defaults.items() if k in names}
    values.update(method=method, format=format, **fields)
    values["wide_linears"] = tuple(values["wide_linears"])
    values["gptq"] = tuple(values["gptq"])
    return cls(**values)
