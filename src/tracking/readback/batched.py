"""A sweep's offline batching table: for each configuration that ran task=batch (its model, hardware, precision,
engine and runner), each batch size's prompt and generation tokens a second, the median over its rounds
(task=batch's batch_* metrics, src.tasks.batch), llama-batched-bench's rows beside quantspec's."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass

from src.common.metrics import markdown_table
from src.tracking.readback.compare import JobRounds, configuration

SIZE = re.compile(r"batch_tg_tokens_per_s_b(\d+)")


@dataclass
class Size:
    config: str  # what decoded: model·hardware·precision·engine, and the runner
    batch: int
    pp: float  # prompt tokens a second, median over rounds
    tg: float  # generated tokens a second
    rounds: int


def sizes(groups: list[JobRounds]) -> list[Size]:
    """Every task=batch job's batch sizes, ordered by configuration, then size."""
    out = []
    for group in groups:
        finished = list(group.finished().values())
        if group.choice("task") != "batch" or not finished:
            continue
        runner = group.shown.tags.get("runner", "?")
        config = configuration(group, runner, f"{runner}, the model's GGUF", ("runner",))
        found = sorted({int(m.group(1)) for r in finished for k in r.metrics if (m := SIZE.fullmatch(k))})
        for b in found:
            pp = [
                r.metrics[f"batch_pp_tokens_per_s_b{b}"] for r in finished if f"batch_pp_tokens_per_s_b{b}" in r.metrics
            ]
            tg = [
                r.metrics[f"batch_tg_tokens_per_s_b{b}"] for r in finished if f"batch_tg_tokens_per_s_b{b}" in r.metrics
            ]
            out.append(Size(config, b, _median(pp), _median(tg), len(tg)))
    return sorted(out, key=lambda s: (s.config, s.batch))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def table(found: list[Size]) -> str:
    one = {s.config: s.tg for s in found if s.batch == 1}
    rows = [
        [
            s.config, s.batch, f"{s.pp:.1f}", f"{s.tg:.1f}",
            f"{s.tg / one[s.config]:.2f}x" if s.config in one and one[s.config] > 0 else "-", s.rounds,
        ]
        for s in found
    ]  # fmt: skip
    headers = ["configuration", "B", "PP tok/s", "TG tok/s", "TG over B=1", "rounds"]
    return markdown_table(headers, rows)
