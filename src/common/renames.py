"""The config's old spellings, each with the name it has now (one name per idea: docs/reference/glossary.md).

Given on a command line or in a YAML of one's own, an old spelling is refused in one line naming the new one
(src.assembly.overrides): run as it was, it would be a setting that no longer exists. Read back from what earlier
runs recorded (their params in the store, a resumed sweep's finished runs), it is taken under its new name
(`current`), so a regression or a report over a store of both ages compares like with like.
"""

from __future__ import annotations

# A precision's field (under precision., and draft.precision. for a draft's) -> its name now.
PRECISION_FIELDS = {
    "scheme": "format",  # the weight format the decoder linears run (src.quant.formats)
    "head_scheme": "head_format",
    "int8_linears": "wide_linears",  # they held 5- and 6-bit linears as well as int8 ones
    "int8_linears_scheme": "wide_format",
}
# (a key's last two parts, an old value) -> the value now: the step paths are named after what runs the step
VALUES = {
    ("engine.step_path", "quantspec"): "cpp",
    ("executed.step_path", "quantspec"): "cpp",
}


def _split(key: str) -> tuple[str, str]:
    head, _, last = key.rpartition(".")
    return head, last


def new_key(key: str) -> str | None:
    """The name a renamed dotted key has now (precision.scheme -> precision.format), or None."""
    head, last = _split(key)
    if (head == "precision" or head.endswith(".precision")) and last in PRECISION_FIELDS:
        return f"{head}.{PRECISION_FIELDS[last]}"
    return None


def new_value(key: str, value: str) -> str | None:
    """The value a renamed value of `key` has now (engine.step_path=quantspec -> cpp), or None."""
    tail = ".".join(key.split(".")[-2:])
    return VALUES.get((tail, value))


def refusal(key: str, value: str | None = None) -> str | None:
    """One line refusing an old spelling and naming the new one, or None where `key`=`value` is current."""
    now = new_key(key)
    if now is not None:
        return f"{key} is now {now}" + ("" if value is None else f": say {now}={value}")
    if value is not None and (renamed := new_value(key, value)) is not None:
        return f"{key}={value} is now {key}={renamed}"
    return None


def current(params: dict[str, str]) -> dict[str, str]:
    """Recorded dotted params under today's names and values (a key recorded under both keeps the new one's)."""
    out = {}
    for key, value in params.items():
        now = new_key(key)
        if now is not None and now in params:
            continue
        key = now or key
        out[key] = new_value(key, value) or value
    return out
