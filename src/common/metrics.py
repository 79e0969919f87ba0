"""The seed tables' columns, computed from one generation's timestamps (the measurement rules:
docs/concepts/measured.md).

Prefill (ms): start of generation to the first new token. Time/Token (ms): the rest of the wall time
divided by (new tokens - 1). Tokens/Sec: 1000 / Time/Token. Total Time (s): the whole generation.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import asdict, dataclass

from src.common.mdtext import md_text  # a table's cells are text by its rule (and md_text is still imported from here)

# Metric names are a contract users query by. Each example's values are series (step = example) under
# their own prefix, named as a series (`by_example/time_per_token_ms`), so that nobody reads a series'
# latest value (MLflow's columns and run page show the last example's) as the job's figure, which is
# `time_per_token_ms_median`. Stores written before this name hold them under LEGACY_EXAMPLE.
ROW_METRICS = ("prompt_tokens", "new_tokens", "total_time_s", "prefill_ms", "time_per_token_ms", "tokens_per_s")
EXAMPLE = "by_example/"
LEGACY_EXAMPLE = "example/"
SEED_HEADERS = (
    "Example#",
    "Prompt Length (tokens)",
    "New Tokens Generated",
    "Total Time (s)",
    "Prefill Phase (ms)",
    "Time/Token (ms)",
    "Tokens/Sec",
)


@dataclass(frozen=True)
class Row:
    example: int
    prompt_tokens: int
    new_tokens: int
    total_time_s: float
    prefill_ms: float
    time_per_token_ms: float
    tokens_per_s: float

    def metrics(self) -> dict[str, float]:
        return {EXAMPLE + k: float(v) for k, v in asdict(self).items() if k in ROW_METRICS}


def timing_row(example: int, prompt_tokens: int, start: float, first_token: float, end: float, new_tokens: int) -> Row:
    """Times in seconds (perf_counter readings). With one new token there is no decode step: NaN, not 0."""
    if new_tokens < 1:
        raise ValueError("a generation with no new token has no timing")
    prefill_s = first_token - start
    total_s = end - start
    per_token_s = (total_s - prefill_s) / (new_tokens - 1) if new_tokens > 1 else math.nan
    per_token_ms = per_token_s * 1000
    return Row(
        example,
        prompt_tokens,
        new_tokens,
        total_s,
        prefill_s * 1000,
        per_token_ms,
        1000 / per_token_ms if per_token_ms > 0 else math.nan,
    )


def median(values: list[float]) -> float:
    """Median of the finite values (NaN marks 'not measured'), NaN if none."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def summarize(rows: list[Row]) -> dict[str, float]:
    return {
        "prefill_ms_median": median([r.prefill_ms for r in rows]),
        "time_per_token_ms_median": median([r.time_per_token_ms for r in rows]),
        "tokens_per_s_median": median([r.tokens_per_s for r in rows]),
        "examples": float(len(rows)),
        "new_tokens_total": float(sum(r.new_tokens for r in rows)),
    }


def _cell(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return md_text(value)


def markdown_table(headers: tuple[str, ...] | list[str], rows: list[list]) -> str:
    """A table whose every cell is text (md_text): a value holding `|`, a newline or HTML cannot break it."""
    headers = [md_text(h) for h in headers]
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(list(headers)), sep] + [line(r) for r in cells])


def summary_table(summary: dict[str, float]) -> str:
    return markdown_table(("metric", "value"), [[k, v] for k, v in summary.items()]) if summary else "(no metrics)"


def seed_table(rows: list[Row]) -> str:
    return markdown_table(
        SEED_HEADERS,
        [
            [
                r.example,
                r.prompt_tokens,
                r.new_tokens,
                r.total_time_s,
                r.prefill_ms,
                r.time_per_token_ms,
                r.tokens_per_s,
            ]
            for r in rows
        ],
    )


def csv_text(rows: list[list]) -> str:
    """Rows as CSV through the csv module: a value holding a comma or a quote is quoted, so every reader
    parses it back into the same cells."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def rows_csv(rows: list[Row]) -> str:
    fields = ["example", *ROW_METRICS]
    return csv_text([fields, *([_cell(getattr(r, f)) for f in fields] for r in rows)])
