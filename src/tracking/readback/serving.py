"""A sweep's serving front: for each configuration that ran task=serve (its model, hardware, precision, engine and
server), its load levels side by side: output tokens a second against time per output token and TTFT, each the
median over the level's rounds (task=serve's serve_* metrics, src.tasks.serve)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from src.common.metrics import markdown_table
from src.tracking.readback.compare import JobRounds, configuration

COLUMNS = (
    ("serve_output_tokens_per_s", "output tok/s"),
    ("serve_requests_per_s", "requests/s"),
    ("serve_ttft_ms_p50", "TTFT p50 (ms)"),
    ("serve_ttft_ms_p99", "TTFT p99 (ms)"),
    ("serve_tpot_ms_p50", "TPOT p50 (ms)"),
    ("serve_itl_ms_p99", "ITL p99 (ms)"),
    ("serve_e2e_ms_p99", "e2e p99 (ms)"),
    ("serve_goodput_per_s", "goodput (req/s)"),
    ("serve_errors", "errors"),
)


@dataclass
class Level:
    config: str  # what serves: model·hardware·precision·engine, and the server
    concurrency: int
    rate: str  # requests a second, or "closed" (as fast as the concurrency allows)
    figures: dict[str, float]  # each COLUMNS metric, median over the level's finished rounds
    rounds: int


def _served(server: str, shown) -> str:
    """What answered the load, in words."""
    if server == "external":
        return f"the server at {shown.params.get('task.base_url', '?')}"
    return {"llama-server": "llama-server, the model's GGUF", "vllm": "vLLM, the float checkpoint"}.get(server, server)


def _median(values: list[float]) -> float:
    values = sorted(v for v in values if not math.isnan(v))
    if not values:
        return math.nan
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def levels(groups: list[JobRounds]) -> list[Level]:
    """Every task=serve job's level, ordered by configuration, then concurrency and rate."""
    out = []
    for group in groups:
        finished = list(group.finished().values())
        if group.choice("task") != "serve" or not finished:
            continue
        shown = group.shown
        server = shown.tags.get("server", "?")
        config = configuration(group, server, _served(server, shown), ("server", "concurrency", "request_rate"))
        figures = {m: _median([r.metrics.get(m, math.nan) for r in finished]) for m, _ in COLUMNS}
        rate = shown.params.get("task.request_rate", "None")
        out.append(
            Level(
                config,
                int(float(shown.params.get("task.concurrency", "1"))),
                "closed" if rate in ("None", "null", "") else rate,
                figures,
                len(finished),
            )
        )
    return sorted(out, key=lambda lv: (lv.config, lv.concurrency, lv.rate))


def table(found: list[Level]) -> str:
    headers = ["configuration", "concurrency", "rate (req/s)", *(label for _, label in COLUMNS), "rounds"]
    rows = [
        [lv.config, lv.concurrency, lv.rate, *(_shown(lv.figures[m]) for m, _ in COLUMNS), lv.rounds] for lv in found
    ]
    return markdown_table(headers, rows)


def _shown(value: float):
    return "-" if math.isnan(value) else float(f"{value:.3g}")


def plot(found: list[Level], path: Path, save) -> Path | None:
    """Output tokens a second against TPOT p50 and TTFT p99, a line per configuration, each point its concurrency."""
    if not found:
        return None

    from matplotlib.figure import Figure  # not at the top: 1.2 s a process pays, drawing or not

    fig = Figure(figsize=(9, 4))
    axes = fig.subplots(1, 2)
    for ax, metric, label in (
        (axes[0], "serve_tpot_ms_p50", "time per output token, p50 (ms)"),
        (axes[1], "serve_ttft_ms_p99", "time to first token, p99 (ms)"),
    ):
        for config in dict.fromkeys(lv.config for lv in found):
            pts = [lv for lv in found if lv.config == config and not math.isnan(lv.figures[metric])]
            xs = [lv.figures["serve_output_tokens_per_s"] for lv in pts]
            ys = [lv.figures[metric] for lv in pts]
            ax.plot(xs, ys, marker="o", label=config)
            for lv, x, y in zip(pts, xs, ys, strict=True):
                ax.annotate(f"c={lv.concurrency}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("output tokens a second (all users)")
        ax.set_ylabel(label)
    axes[0].set_title("the serving front: throughput against latency; each point one load level")
    axes[1].legend(fontsize=7)
    save(fig, path)
    return path
