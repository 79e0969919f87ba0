"""A sweep's jobs across their rounds (src.tracking.sweep.rounds), and the comparisons a report makes of them.

A job's time per token is the median over its rounds of each round's median over the examples; its
speedup over the baseline is the median of the per-round ratios (baseline's round r / job's round r),
each with its min–max. A round timed while the host was busy (the run's tag host_busy: another process
used more than tracking.busy_cores) is left out of these wherever a quiet round remains, and counted as
excluded; where every round was busy they are kept and marked `all busy`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from src.common.axes import AXES
from src.tracking.readback.sweeps import JobRecord
from src.tracking.store.names import CONFIG_KEY


def ratio(a: float | None, b: float | None) -> float:
    """a / b where both were measured, else NaN."""
    return a / b if a and b and not (math.isnan(a) or math.isnan(b)) else math.nan


def busy(run: JobRecord) -> bool:
    return run.tags.get("host_busy") == "true"


def quiet(runs: list[JobRecord]) -> list[JobRecord]:
    """The rounds timed on a quiet host; all of them where every round was busy."""
    return [r for r in runs if not busy(r)] or runs


def round_of(run: JobRecord) -> int:
    try:
        return int(run.tags.get("round", "1"))
    except ValueError:
        return 1


@dataclass
class Spread:
    """A median with its min–max over the rounds it used."""

    median: float
    low: float
    high: float
    used: int  # rounds in the figure
    excluded: int = 0  # busy rounds left out
    all_busy: bool = False

    def text(self, unit: str = "", digits: int = 3, what: str = "") -> str:
        """`2.87× over fp32 (2.66–3.13×, 4 rounds) [1 busy round left out]`: what: after the median."""
        if math.isnan(self.median):
            return "nan"
        figure = f"{self.median:.{digits}g}{unit}{what}"
        if self.used > 1:
            figure += f" ({self.low:.{digits}g}–{self.high:.{digits}g}{unit}, {self.used} rounds)"
        return figure + self.caveat()

    def caveat(self) -> str:
        if self.all_busy:
            return " [every round busy]"
        return f" [{self.excluded} busy round{'s' * (self.excluded > 1)} left out]" if self.excluded else ""


NO_SPREAD = Spread(math.nan, math.nan, math.nan, 0)


def spread(values: dict[int, tuple[float, bool]]) -> Spread:
    """values: round -> (value, busy). Quiet rounds where there are any, else all, marked."""
    finite = {r: v for r, v in values.items() if v[0] is not None and not math.isnan(v[0])}
    quiet = [v for v, was_busy in finite.values() if not was_busy]
    used = quiet or [v for v, _ in finite.values()]
    if not used:
        return NO_SPREAD
    return Spread(
        statistics.median(used),
        min(used),
        max(used),
        len(used),
        excluded=len(finite) - len(quiet) if quiet else 0,
        all_busy=not quiet,
    )


@dataclass
class JobRounds:
    """One job of the sweep (its choices) across its rounds: the latest attempt of each round."""

    key: str
    runs: list[JobRecord] = field(default_factory=list)

    @property
    def shown(self) -> JobRecord:
        """The run that stands for the job in the UI's view: its earliest round."""
        return min(self.runs, key=round_of)

    @property
    def name(self) -> str:
        return self.shown.name

    def choice(self, group: str) -> str:
        return self.shown.choice(group)

    def finished(self) -> dict[int, JobRecord]:
        return {round_of(r): r for r in self.runs if r.tags.get("outcome") == "finished"}

    @property
    def outcome(self) -> str:
        outcomes = [r.tags.get("outcome", "?") for r in sorted(self.runs, key=round_of)]
        if len(outcomes) == 1:
            return outcomes[0]
        done = outcomes.count("finished")
        return "finished" if done == len(outcomes) else f"{done} of {len(outcomes)} rounds finished"

    def spread(self, metric: str) -> Spread:
        return spread({r: (run.metrics.get(metric, math.nan), busy(run)) for r, run in self.finished().items()})

    def busy_rounds(self) -> list[int]:
        return sorted(r for r, run in self.finished().items() if busy(run))


def job_rounds(jobs: list[JobRecord]) -> list[JobRounds]:
    """The sweep's jobs grouped by their identity across rounds, in the order their first rounds ran."""
    out: dict[str, JobRounds] = {}
    for job in jobs:
        key = job.tags.get(CONFIG_KEY, job.run_id)  # runs from before rounds: one round each
        out.setdefault(key, JobRounds(key)).runs.append(job)
    return list(out.values())


def baseline_of(config: JobRounds, all_configs: list[JobRounds], baseline: dict[str, str]) -> JobRounds | None:
    """The job that differs from this one only in the baseline's choices, if it finished a round."""
    want = {g: baseline.get(g, config.choice(g)) for g in AXES}  # a job's identity across its rounds
    for other in all_configs:
        if other.finished() and all(other.choice(g) == v for g, v in want.items()):
            return other
    return None


def ratio_spread(config: JobRounds, base: JobRounds, metric: str, inverse: bool = True) -> Spread:
    """Per-round ratios, round r with round r: base/job (a speedup) or job/base (inverse=False)."""
    mine, theirs = config.finished(), base.finished()
    values = {}
    for r in sorted(set(mine) & set(theirs)):
        a, b = mine[r].metrics.get(metric), theirs[r].metrics.get(metric)
        value = ratio(b, a) if inverse else ratio(a, b)
        if not math.isnan(value):
            values[r] = (value, busy(mine[r]) or busy(theirs[r]))
    return spread(values)


@dataclass
class Speedup:
    job: JobRounds
    base: JobRounds
    time: Spread  # time/token: baseline's / the job's, per round
    prefill: Spread

    @property
    def is_baseline(self) -> bool:
        return self.job.key == self.base.key

    def busy_sides(self) -> list[str]:
        """Where the time ratio stands on busy timings only: 'job', 'baseline' or both ([] when a quiet round
        gave it, since busy rounds are then left out)."""
        if not self.time.all_busy:
            return []
        mine, theirs = self.job.finished(), self.base.finished()
        common = set(mine) & set(theirs)
        return [side for side, runs in (("job", mine), ("baseline", theirs)) if any(busy(runs[r]) for r in common)]


def condition(figure: Spread, sides: list[str] | None = None) -> str:
    """What a figure's reader must know before its value, in a few characters: `BUSY baseline, 1 round`,
    `BUSY, 1 round`, `1 round`, or '' for a median of several quiet rounds. `sides`: Speedup.busy_sides()."""
    said = []
    if figure.all_busy:
        said.append("BUSY" + (f" {'+'.join(sides)}" if sides and sides != ["job"] else ""))
    if figure.used == 1:
        said.append("1 round")
    return ", ".join(said)


def speedups(all_configs: list[JobRounds], baseline: dict[str, str]) -> list[Speedup]:
    out = []
    for config in all_configs:
        base = baseline_of(config, all_configs, baseline)
        if base is None or not config.finished():
            continue
        out.append(
            Speedup(
                config,
                base,
                ratio_spread(config, base, "time_per_token_ms_median"),
                ratio_spread(config, base, "prefill_ms_median"),
            )
        )
    return out


def configuration(group: JobRounds, who: str, peer: str, shown_apart: tuple[str, ...]) -> str:
    """What a job stands for in a table: model·hardware·precision·engine and the settings its sweep varied, then who
    ran it. A peer (`who` other than quantspec; `peer` says what it ran) runs its own copy of the model, so the
    job's precision and engine are not what ran and are left out."""
    shown = group.shown
    hidden = ("task", "draft") if who == "quantspec" else ("task", "draft", "precision", "engine")
    parts = [*(shown.choice(a) for a in AXES if a not in hidden), *swept(group.name, shown_apart)]
    return "·".join(parts) + (" (quantspec)" if who == "quantspec" else f" ({peer})")


def swept(name: str, shown_apart: tuple[str, ...]) -> list[str]:
    """The settings a sweep varied beside the choices, as the job's name gives them (`batch_activations=int8`), but
    those the table shows in columns of their own: what tells two rows of the same choices apart."""
    parts = name.split(" round ")[0].split("·")
    return [p for p in parts if "=" in p and p.split("=", 1)[0] not in shown_apart]
