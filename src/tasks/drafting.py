"""What a timed task records about its draft: per example, and summed up with Leviathan's estimate.

Per example (MLflow series, step = example): acceptance rate, proposals kept per step, draft and
verify time per step, the example's time/token without the draft (timed beside it) and the speedup.
Summary (names ending _overall or _median: MLflow shows a series' last step as its value, so a
summary never reuses a series' name): the same over all examples, plus the draft/target cost ratio c, the alpha that explains the
kept proposals per step, the expected speedup from (alpha, k, c) and the measured one.
"""

from __future__ import annotations

import math

from src.common.metrics import median
from src.engine.leviathan import alpha_from_accepted, expected_speedup


def example_series(spec, per_token_ms: float, baseline_ms: float | None) -> dict[str, float]:
    out = {
        "acceptance_rate": spec.acceptance_rate,
        "accepted_per_step": spec.mean_accepted,
        "draft_k_mean": spec.mean_k,
        "draft_ms_per_step": spec.draft_s * 1000 / spec.steps if spec.steps else math.nan,
        "verify_ms_per_step": spec.verify_s * 1000 / spec.steps if spec.steps else math.nan,
    }
    if baseline_ms is not None:
        out["baseline_time_per_token_ms"] = baseline_ms
        out["speedup_vs_no_draft"] = baseline_ms / per_token_ms if per_token_ms > 0 else math.nan
    return out


def summary(
    specs: list, per_token_ms: list[float], baseline_ms: list[float] | None, identical: list[bool] | None
) -> dict[str, float]:
    steps = sum(s.steps for s in specs)
    proposed = sum(s.proposed for s in specs)
    kept = sum(s.accepted for s in specs)
    k = proposed / steps if steps else math.nan
    draft_ms = sum(s.draft_s for s in specs) * 1000 / steps if steps else math.nan
    # Pooled over every step of every example ("_overall"); per-example values are the series.
    out = {
        "acceptance_rate_overall": kept / proposed if proposed else math.nan,
        "accepted_per_step_overall": kept / steps if steps else math.nan,
        "tokens_per_step_overall": (kept + steps) / steps if steps else math.nan,
        "draft_k_mean_overall": k,
        "draft_ms_per_step_overall": draft_ms,
        "verify_ms_per_step_overall": sum(s.verify_s for s in specs) * 1000 / steps if steps else math.nan,
    }
    alpha = alpha_from_accepted(out["accepted_per_step_overall"], k)
    out["alpha_estimated"] = alpha
    if baseline_ms:
        base = median(baseline_ms)
        # c: one draft forward against one plain target step, both measured in this job
        c = draft_ms / k / base if k and k > 0 and base > 0 else math.nan
        out.update(
            {
                "baseline_time_per_token_ms_median": base,
                "speedup_vs_no_draft_median": base / median(per_token_ms),
                "draft_cost_ratio": c,
                "expected_speedup": expected_speedup(alpha, k, c),
            }
        )
    if identical is not None:
        out["output_identical_fraction"] = sum(identical) / len(identical)
    return out
