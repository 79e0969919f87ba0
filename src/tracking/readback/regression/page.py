"""A comparison written out: regress.md, regress.csv and regress.png (both sweeps side by side)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from src.common.mdtext import md_text
from src.common.metrics import markdown_table
from src.tracking.readback.regression.judge import Comparison
from src.tracking.store.names import key_of


def markdown(c: Comparison) -> str:
    level = f"{c.confidence:.0%}"
    lines = [
        f"# {md_text(c.new.sweep_id)} against {md_text(c.old.sweep_id)}",
        "",
        f"Ratios are new / old: above 1 is slower (or, for a quality figure, higher), with a {level} "
        f"bootstrap interval: of the median of the examples' ratios where both sweeps ran the same examples "
        f"(each side the median of its quiet rounds), else of the ratio of the rounds' medians. Verdicts: slower "
        f"or faster where the whole interval is beyond 1 ± {c.tolerance:g} (tolerance), no change otherwise.",
        "",
    ]
    if c.rows:
        lines += [
            markdown_table(
                ["job", "figure", "old", "new", "new / old", f"{level} interval", "over", "verdict"],
                [
                    [
                        r.name,
                        r.figure,
                        f"{r.old:.4g}",
                        f"{r.new:.4g}",
                        f"{r.ratio:.3f}",
                        "–" if math.isnan(r.low) else f"{r.low:.3f}–{r.high:.3f}",
                        r.basis,
                        r.verdict,
                    ]
                    for r in c.rows
                ],
            ),
            "",
        ]
    else:
        lines += ["No job finished in both sweeps.", ""]
    for title, items in (
        ("Not judged (a gate, fail_on, fails on these unless unjudged=pass)", c.unjudged),
        ("New jobs (not in the old sweep)", c.added),
        ("Removed jobs (only in the old sweep)", c.removed),
        ("Failed or killed jobs", c.failed),
    ):
        if items:
            lines += [f"## {title}", "", *[f"- {md_text(i)}" for i in items], ""]
    lines += ["## What differs between the two sweeps' hosts", ""]
    if c.host_changes:
        lines += [
            markdown_table(["", "old", "new"], [list(ch) for ch in c.host_changes]),
            "",
            "A ratio between sweeps measured under different conditions is the code's change only where these "
            "do not matter.",
            "",
        ]
    else:
        lines += ["Nothing recorded differs (governor, turbo, huge pages, kernel, library versions, commit, CPU).", ""]
    return "\n".join(lines)


def plot(c: Comparison, path: Path) -> None:
    rows = [r for r in c.rows if r.figure == "time/token"]
    from matplotlib.figure import Figure  # not at the top: 1.2 s a process pays, drawing or not

    fig = Figure(figsize=(max(6, 1.2 * len(rows) + 2), 4))
    ax = fig.subplots()
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r.old for r in rows], 0.4, label="old")
    ax.bar(
        [i + 0.2 for i in x],
        [r.new for r in rows],
        0.4,
        label="new",
        color=[
            "tab:red" if r.verdict == "slower" else "tab:green" if r.verdict == "faster" else "tab:gray" for r in rows
        ],
    )
    ax.set_xticks(list(x), [r.name for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("time/token (ms), median")
    ax.set_title("new (red: slower, green: faster, gray: no change) against the old sweep")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(c: Comparison, out: Path) -> Path:
    folder = out / f"regress-{key_of(c.old.sweep_id + ' ' + c.new.sweep_id)[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "regress.md").write_text(markdown(c))
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["job", "figure", "old", "new", "ratio", "low", "high", "over", "verdict"])
    for r in c.rows:
        writer.writerow([r.name, r.figure, r.old, r.new, r.ratio, r.low, r.high, r.basis, r.verdict])
    (folder / "regress.csv").write_text(buf.getvalue())
    plot(c, folder / "regress.png")
    return folder
