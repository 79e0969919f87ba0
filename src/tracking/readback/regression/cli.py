"""Compare a sweep with an older one: is this commit, library or machine slower than before?

    python -m src.regress against=<sweep dir or id, or its parent run id>           # the latest sweep against it
    python -m src.regress against=multirun/2026-11-20/10-00-00-1 sweep=multirun/2026-11-25/... fail_on=0.05

Jobs are matched by their composed config, without what names the sweep (its directory, rounds, store, cache):
the same model, hardware, precision, draft, task, engine, dataset and sampling with the same fields. For each
matched job: the ratio of time/token (and prefill, and the quality figure where both have one), new over
old, with its interval from the per-round figures (or, with one round on a side, the per-example ones):
paired by example where both sweeps ran the same examples (each example's new / old, each side the median
of its rounds), else the ratio of the rounds' medians; the median ratio with a bootstrap interval at `confidence`. The verdict is `slower` where the whole interval is
above 1 + `tolerance` (0.03), `faster` where it is below 1 - `tolerance`, `no change` otherwise: the interval holds
the examples' and rounds' spread, not what moves a whole sweep minutes later. New, removed and failed jobs are listed, and what
can change a figure on the same code (the host's governor, turbo, transparent huge pages, kernel, library
versions, the commit and a dirty tree: params `host.*`, tag git_commit) is compared between the two sweeps.

Exit 0, or 1 where a matched job is slower with confidence by more than `fail_on` (a fraction: 0.05 = 5%;
null: never) in the figure `metric` names (time per token, or prefill, or the p99 of TTFT or ITL, each
round's own p99 compared as the median is; a serving level's TTFT and ITL p99 are its requests', and its output
tokens a second and goodput are worse where they fall), or 2 for a setting that does not exist or a sweep that cannot be found (one line). The gate
(`fail_on`) fails closed: exit 3 where it could not judge a job (failed, killed or missing in the new sweep,
or a time/token with no interval: one round and fewer than three examples on a side) or nothing matched,
unless `unjudged=pass`; what it could not judge is listed in the report either way. Writes
`regress.md`, `regress.csv` and `regress.png` (both sweeps side by side) under `<out>/regress-<key>/`.
"""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from src.common.environment import PROJECT_ROOT
from src.common.say import say
from src.common.settings import Command, Setting, SettingError
from src.tracking.readback.command import start
from src.tracking.readback.regression.judge import GATES, compare, load
from src.tracking.readback.regression.page import markdown, write

# tolerance: a ratio is slower (faster) only where its whole interval lies above 1 + tolerance (below
# 1 - tolerance); anything else is no change. The intervals hold the
# examples' and rounds' spread, not what moves a whole sweep (the host's state minutes apart): two sweeps of
# the same code on the same host here differed by 0.2-1.3% with intervals a few tenths of a percent wide.
COMMAND = Command(
    "python -m src.regress",
    __doc__,
    [
        Setting(
            "against",
            None,
            "the old sweep, to compare against: its directory, its id or its parent run's id (required)",
            purpose="which sweeps",
        ),
        Setting("sweep", None, "the new sweep, named the same ways (null: the latest sweep)", purpose="which sweeps"),
        Setting(
            "tracking.uri",
            None,
            "the store both sweeps are in (null: MLFLOW_TRACKING_URI, else the project's mlflow.db)",
            purpose="which sweeps",
        ),
        Setting("experiment", "quantspec", "the MLflow experiment they were recorded under", purpose="which sweeps"),
        Setting("confidence", 0.95, "the bootstrap interval's level, in [0.5, 1)", purpose="the verdict"),
        Setting(
            "tolerance",
            0.03,
            "how far past 1 the whole interval must lie for slower or faster (a fraction)",
            purpose="the verdict",
        ),
        Setting(
            "fail_on",
            None,
            "exit 1 where a job is slower with confidence by more than this fraction (null: never)",
            float,
            purpose="the gate (its exit code)",
        ),
        Setting(
            "metric",
            "time_per_token",
            "the figure the gate judges: time per token (median), prefill, the p99 of TTFT or ITL, or a serving "
            "level's output tokens a second or goodput",
            choices=tuple(GATES),
            purpose="the gate (its exit code)",
        ),
        Setting(
            "unjudged",
            "fail",
            "fail (exit 3) or pass where the gate could not judge a job",
            choices=("fail", "pass"),
            purpose="the gate (its exit code)",
        ),
        Setting("out", "reports", "the folder the regress-<key>/ files are written under", purpose="what it writes"),
    ],
    renamed={"baseline": ("against", "the old sweep; baseline.<axis>= is src.report's job each speedup is over")},
)


def usage() -> str:
    return COMMAND.usage()


def settings(argv: list[str]) -> dict:
    """The command line's settings, checked; SettingError (one line) for one that is not one."""
    cfg, _ = COMMAND.parse(argv)
    if not cfg["against"]:
        raise SettingError(
            "against=<sweep directory, sweep id or parent run id> is needed: the old sweep to compare against"
        )
    if not 0.5 <= cfg["confidence"] < 1:
        raise SettingError(f"confidence={cfg['confidence']} must be in [0.5, 1)")
    if not 0 <= cfg["tolerance"] < 1:
        raise SettingError(f"tolerance={cfg['tolerance']} must be in [0, 1) (a fraction: 0.03 is 3%)")
    if cfg["fail_on"] is not None and cfg["fail_on"] < 0:
        raise SettingError(f"fail_on={cfg['fail_on']} must be 0 or more (a fraction: 0.05 is 5% slower)")
    return cfg


def main(argv: list[str]) -> int:
    started = start(argv, usage, settings)
    if isinstance(started, int):
        return started
    cfg, uri = started
    client = MlflowClient(uri)
    try:
        base = load(client, cfg["experiment"], cfg["against"])
        new = load(client, cfg["experiment"], cfg["sweep"])
    except LookupError as err:
        say(str(err), err=True)
        return 2
    if base.parent_id == new.parent_id:
        say(f"against and sweep are the same sweep ({base.sweep_id}); name another with sweep=...", err=True)
        return 2
    c = compare(client, base, new, cfg["confidence"], cfg["tolerance"], GATES[cfg["metric"]])
    folder = write(c, PROJECT_ROOT / cfg["out"])
    print(markdown(c))
    print(f"written to {folder}")
    if cfg["fail_on"] is not None:
        slow = c.slower_than(cfg["fail_on"])
        if slow:
            say(
                f"{len(slow)} job(s) slower than the old sweep by more than {cfg['fail_on']:.0%}"
                + (f" in {c.gate}" if c.gate != "time/token" else "")
                + f" at {c.confidence:.0%} confidence: {', '.join(r.name for r in slow)}",
                err=True,
            )
            return 1
        if c.unjudged and cfg["unjudged"] == "fail":  # fail closed: what the gate could not see, it does not pass
            say(
                f"the gate could not judge {len(c.unjudged)} thing(s): {c.unjudged[0]}"
                + (f" (and {len(c.unjudged) - 1} more, in regress.md)" if len(c.unjudged) > 1 else "")
                + "; fix the sweeps, or pass unjudged=pass to let the gate pass them",
                err=True,
            )
            return 3
    return 0
