"""Values as strict JSON holds them: a figure that is NaN or infinite (not measured, a one-token example's time
per token) becomes null, which every JSON reader takes (Python's json writes NaN, which JavaScript's and jq's
parsers refuse); paths and tuples become strings and lists."""

from __future__ import annotations

import math
from pathlib import Path


def jsonable(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
