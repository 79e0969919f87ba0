#!/usr/bin/env python
"""Every draft kind against the same target without a draft, in one sweep; why each pays or not.

    .venv/bin/python scripts/bench_draft.py                          # gemma3-270m, bf16 and fp32 targets
    .venv/bin/python scripts/bench_draft.py precision=w8a8 draft.k=3 # any extra Hydra overrides
    .venv/bin/python scripts/bench_draft.py task=decode              # one task instead of decode,benchmark
    .venv/bin/python scripts/bench_draft.py --doc                    # also on the docs' benchmark page

One sweep over precision (the target) x draft=prompt_lookup,self_w4a16,self_w8a8,self_w8a8_vocab4k x
task=decode,benchmark (greedy). Each job
times every example with its draft and, in turns, without it (draft.baseline), so the measured
speedup is side by side; it also logs the acceptance, the draft length k, the draft/target cost ratio
c and Leviathan's expected speedup from them. Figures are read back from the MLflow store.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from src.common import benchpage  # noqa: E402
from src.common.metrics import markdown_table  # noqa: E402
from src.tracking import default_uri  # noqa: E402
from src.tracking.report import save_markdown  # noqa: E402
from src.tracking.sweeps import sweep_jobs  # noqa: E402

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


def main(argv: list[str]) -> int:
    doc, overrides = "--doc" in argv, [a for a in argv if a != "--doc"]
    uri = next((o.split("=", 1)[1] for o in overrides if o.startswith("tracking.uri=")), default_uri())
    sweep_dir = ROOT / "multirun" / f"bench-draft-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    target = next((o.split("=", 1)[1] for o in overrides if o.startswith("precision=")), "bf16,fp32")
    tasks = next((o.split("=", 1)[1] for o in overrides if o.startswith("task=")), "decode,benchmark")
    cmd = [
        sys.executable,
        "-m",
        "src.run",
        "-m",
        f"draft={','.join(DRAFTS)}",
        f"task={tasks}",
        f"precision={target}",
        f"hydra.sweep.dir={sweep_dir}",
        *[o for o in overrides if not o.startswith(("precision=", "task="))],
    ]
    print("running:", " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode == 2:  # the command line refused, in one line: no sweep to read back
        return 2
    _, jobs = sweep_jobs(uri, sweep_id=str(sweep_dir.resolve()))
    rows = []

    def order(j):
        draft = j.choice("draft")
        return j.choice("precision"), j.choice("task"), DRAFTS.index(draft) if draft in DRAFTS else len(DRAFTS)

    for j in sorted(jobs, key=order):
        key = [j.choice("precision"), j.choice("task"), j.choice("draft")]
        if j.tags.get("outcome") != "finished":
            rows.append(key + [j.tags.get("outcome", "?")] + [math.nan] * len(COLUMNS))
            continue
        rows.append(key + ["finished"] + [j.metrics.get(k, math.nan) for k, _ in COLUMNS])
    table = markdown_table(["target", "task", "draft", "outcome"] + [title for _, title in COLUMNS], rows)
    print(f"\n{table}")
    save_markdown(sweep_dir.name, f"`{' '.join(cmd[2:])}`\n\n{table}\n")
    benchpage.record(
        doc,
        "drafts",
        "Every draft kind against no draft",
        f"`python -m src.run {' '.join(cmd[3:])}`: "
        f"each speedup against the same job's examples timed without the draft, in turns.\n\n{table}",
    )
    return done.returncode


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
