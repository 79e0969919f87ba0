"""Quality beside speed for every precision in one sweep: how far each departs from the fp32 reference (KL, top-1,
Δ perplexity, how soon its greedy decode leaves fp32's), its decode time, the speed–quality front, and paired
comparisons that say whether a difference in KL is more than the tokens' own spread.

    .venv/bin/python -m scripts.bench_quality                          # gemma3-270m, every precision, 2 rounds
    .venv/bin/python -m scripts.bench_quality precisions=fp32,w8a16,w4a16 rounds=3 doc=true

One sweep, `task=perplexity,decode` over the precisions: perplexity scores the dataset's windows (8 of 512
HumanEval tokens on the default model) against the fp32 reference pass; decode times the seed prompts in
interleaved rounds and records where each output first differs from fp32's. A pair `A:B` in `pairs` is tested on
the same tokens (per-token KL, A − B: below 0, A departs less). Figures are read back from the MLflow store; the
report the sweep writes (reports/) holds every pair and the front's plot.
"""

from __future__ import annotations

import math
import sys

from mlflow.tracking import MlflowClient

from scripts import bench
from src.common.metrics import markdown_table
from src.common.say import say
from src.common.settings import Setting
from src.tracking.readback import speed_quality as q
from src.tracking.readback.compare import JobRounds, job_rounds
from src.tracking.readback.reporting.settings import DEFAULT_QUALITY

COMMAND = bench.command(
    "bench_quality",
    __doc__,
    [
        Setting("precisions", bench.every_precision(), "the precisions swept (fp32 is the reference)"),
        Setting("rounds", 2, "interleaved rounds of the decode's timing (quality agrees between rounds)"),
        Setting(
            "pairs",
            ("w4a16_int8:rtn", "w4a8:w4a16_int8", "w8a8:w8a16", "bf16:w8a16"),
            "configuration pairs A:B tested paired on the same tokens, each a precision and any field the sweep "
            "varies ('w4a16 head_format=w6a16'); by default AWQ against round-to-nearest and int8 activations "
            "against 16-bit, each at the same weight bits (4 with the int8 mix, and 8), bf16 against int8 weights",
        ),
    ],
)


def _pm(value: float, se: float, digits: int = 3) -> str:
    if math.isnan(value):
        return "–"
    return f"{value:.{digits}g} ± {se:.2g}" if not math.isnan(se) else f"{value:.{digits}g}"


def name(c: JobRounds) -> str:
    """A configuration as a row and a pair name it: its precision and any field its sweep varied
    (`w4a16 head_format=w6a16`)."""
    return " ".join([c.choice("precision"), *q.fields(c)])


def _rows(groups: list[JobRounds], precisions: tuple[str, ...], min_ratio: float) -> list[list[str]]:
    """One row per configuration, in the order of `precisions`: its decode time (median and range over rounds)
    and the weight bytes a step reads, then its perplexity job's departure from the reference and its decode
    job's."""
    by = {(name(c), c.choice("task")): c for c in groups}
    configs = sorted(
        {n for n, _ in by if n.split(" ")[0] in precisions}, key=lambda n: (precisions.index(n.split(" ")[0]), n)
    )
    rows = []

    def fig(c: JobRounds | None, metric: str) -> float:
        return c.spread(metric).median if c else math.nan

    for p in configs:
        ppl, dec = by.get((p, "perplexity")), by.get((p, "decode"))
        ratio = fig(ppl, "quality_ratio")
        time = dec.spread("time_per_token_ms_median") if dec else None
        p99 = (fig(ppl, "kl_p99"), fig(ppl, "kl_p99_low"), fig(ppl, "kl_p99_high"))
        rows.append(
            [
                p + (" ⚠" if ratio < min_ratio else ""),
                "–" if time is None else time.text(digits=3),
                "–" if math.isnan(fig(dec, "step_weight_mb")) else f"{fig(dec, 'step_weight_mb'):.3g}",
                _pm(fig(ppl, "kl_mean"), fig(ppl, "kl_mean_se")),
                "–" if math.isnan(p99[0]) else f"{p99[0]:.3g} ({p99[1]:.3g}–{p99[2]:.3g})",
                "–" if math.isnan(fig(ppl, "top1_agreement")) else f"{fig(ppl, 'top1_agreement'):.3f}",
                _pm(fig(ppl, "delta_perplexity"), fig(ppl, "delta_perplexity_se")),
                "–" if math.isnan(ratio) else f"{ratio:.4g}",
                _pm(fig(dec, "first_divergent_token"), fig(dec, "first_divergent_token_se")),
                _pm(fig(dec, "divergent_share"), fig(dec, "divergent_share_se")),
            ]
        )
    return rows


def _title(precisions: tuple[str, ...], overrides: list[str]) -> str:
    """The entry's question: every precision, or the precisions and the precision fields the sweep varies."""
    varied = [
        o.split("=", 1)[0].removeprefix("precision.") for o in overrides if "," in o and o.startswith("precision.")
    ]
    if not varied:
        return f"Quality beside speed: {len(precisions)} precisions against fp32"
    return f"Quality beside speed: {', '.join(precisions)} by {' and '.join(varied)}"


def main(argv: list[str]) -> int:
    args, overrides = bench.parse(COMMAND, argv)
    pairs = set()
    for pair in args.pairs:
        a, sep, b = pair.partition(":")
        if not sep or not a or not b:
            say(f"pairs={pair} is not A:B (two configurations, as w4a16:rtn)", err=True)
            return 2
        pairs.add((a, b))
    sweep = bench.run_sweep(
        "quality",
        [f"precision={','.join(args.precisions)}", "task=perplexity,decode", f"rounds={args.rounds}", *overrides],
    )
    if sweep is None:
        return 2
    groups = job_rounds(sweep.finished)
    min_ratio = DEFAULT_QUALITY["min_ratio"]
    ratios = q.quality_ratios(groups, "fp32")
    flags = q.flags(groups, ratios, min_ratio)
    head = [
        "precision",
        "decode ms/token",
        "weights read a token (MB)",
        "KL mean ± se",
        "KL p99 (95% CI)",
        "top-1",
        "Δ perplexity ± se",
        "quality ratio",
        "first divergent token ± se",
        "divergent share ± se",
    ]
    reference = next((c.shown.tags.get("reference", "") for c in groups if c.choice("task") == "perplexity"), "")
    ref_ppl = next((c.spread("reference_perplexity").median for c in groups if c.choice("precision") == "fp32"), None)
    metric, points = q.front_of(groups, "kl_mean", flags)
    paired = q.paired_table(MlflowClient(sweep.uri), groups, keep=lambda a, b: (name(a), name(b)) in pairs)
    text = "\n\n".join(
        [
            markdown_table(head, _rows(groups, args.precisions, min_ratio)),
            f"(⚠: below {min_ratio} of the reference's quality, {reference or 'fp32'}"
            + (f", perplexity {ref_ppl:.4g}" if ref_ppl and not math.isnan(ref_ppl) else "")
            + ".) The speed–quality front on KL (★: no other precision is both at least as fast and as close):",
            q.front_table(points, metric),
            "Paired on the same tokens (A − B per-token KL: below 0, A departs less from the reference):",
            paired or "(no pair of the sweep's precisions was asked for)",
        ]
    )
    sweep.publish(
        args.doc,
        "quality",
        _title(args.precisions, overrides),
        text,
        f"`{sweep.command}`: decode on the seed prompts in {args.rounds} interleaved rounds; perplexity's "
        f"windows against the fp32 reference pass.",
    )
    return sweep.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
