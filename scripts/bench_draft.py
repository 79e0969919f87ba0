"""Every draft kind against the same target without a draft, in one sweep; why each pays or not.

    .venv/bin/python -m scripts.bench_draft                          # gemma3-270m, bf16 and fp32 targets
    .venv/bin/python -m scripts.bench_draft precision=w8a8 draft.k=3 # any extra Hydra overrides
    .venv/bin/python -m scripts.bench_draft task=decode              # one task instead of decode,benchmark
    .venv/bin/python -m scripts.bench_draft doc=true                 # also on the docs' benchmark page

One sweep over precision (the target) x draft=prompt_lookup,self_w4a16,self_w8a8,self_w8a8_vocab4k x
task=decode,benchmark (greedy). Each job
times every example with its draft and, in turns, without it (draft.baseline), so the measured
speedup is side by side; it also logs the acceptance, the draft length k, the draft/target cost ratio
c and Leviathan's expected speedup from them. Figures are read back from the MLflow store.
"""

from __future__ import annotations

import math
import sys

from scripts import bench
from src.common.metrics import markdown_table
from src.common.settings import Setting

DRAFTS = ["prompt_lookup", "self_w4a16", "self_w8a8", "self_w8a8_vocab4k"]
COLUMNS = [
    ("baseline_time_per_token_ms_median", "no draft ms/token"),
    ("time_per_token_ms_median", "ms/token"),
    ("speedup_vs_no_draft_median", "measured speedup"),
    ("expected_speedup", "expected (Leviathan)"),
    ("acceptance_rate_overall", "acceptance"),
    ("alpha_estimated", "alpha"),
    ("tokens_per_step_overall", "tokens/step"),
    ("draft_k_mean_overall", "k"),
    ("draft_cost_ratio", "c"),
    ("draft_ms_per_step_overall", "draft ms/step"),
    ("verify_ms_per_step_overall", "verify ms/step"),
    ("output_identical_fraction", "identical output"),
]


COMMAND = bench.command(
    "bench_draft",
    __doc__,
    [
        Setting("drafts", tuple(DRAFTS), "the draft kinds swept, each against the same target without a draft"),
        Setting("precision", "bf16,fp32", "the targets' precisions (a sweep)"),
        Setting("task", "decode,benchmark", "the tasks (a sweep)"),
    ],
)


def main(argv: list[str]) -> int:
    args, overrides = bench.parse(COMMAND, argv)
    sweep = bench.run_sweep(
        "draft",
        [f"draft={','.join(args.drafts)}", f"task={args.task}", f"precision={args.precision}", *overrides],
    )
    if sweep is None:
        return 2
    jobs = sweep.jobs
    rows = []

    def order(j):
        draft = j.choice("draft")
        return j.choice("precision"), j.choice("task"), DRAFTS.index(draft) if draft in DRAFTS else len(DRAFTS)

    figures = sweep.by("precision", "task", "draft")  # each the median over its quiet rounds
    seen = set()
    for j in sorted(jobs, key=order):
        key = (j.choice("precision"), j.choice("task"), j.choice("draft"))
        if key in seen:  # another round of the same configuration
            continue
        seen.add(key)
        if key not in figures:
            rows.append([*key, j.tags.get("outcome", "?")] + [math.nan] * len(COLUMNS))
            continue
        rows.append([*key, "finished"] + [figures[key].get(k, math.nan) for k, _ in COLUMNS])
    table = markdown_table(["target", "task", "draft", "outcome"] + [title for _, title in COLUMNS], rows)
    sweep.publish(
        args.doc,
        "drafts",
        "Every draft kind against no draft",
        table,
        f"`{sweep.command}`: each speedup against the same job's examples timed without the draft, in turns.",
    )
    return sweep.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
