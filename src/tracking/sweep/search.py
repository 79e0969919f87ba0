"""A search over the Hydra space for the speed–quality front: `hydra/sweeper=search`.

    python -m src.run -m hydra/sweeper=search precision=bf16,w8a8,w8a16,w4a16 draft=none,prompt_lookup \\
        draft.k=range(2,7) hardware.threads=1,2 hydra.sweeper.trials=12

Every override with several values (`a,b`, `choice(...)`, `range(a,b)`) is a searched axis, `interval(a,b)` a
continuous one; the rest are fixed. `task=...` is not searched: each trial runs every task listed (by default
the composed one, decode), and the objectives are read from the trial's jobs. Optuna (`hydra.sweeper.sampler`:
nsga2, multi-objective, by default; tpe; random) asks for `hydra.sweeper.batch` trials at a time, up to
`hydra.sweeper.trials`; each trial's jobs are ordinary jobs of the sweep (one MLflow parent, journals, resume),
timed in interleaved rounds like any sweep (`rounds`, `busy_reruns`: a batch whose round was timed busy is
measured again), and each objective is the median over the trial's quiet rounds; a trial with every round busy
keeps its figures, marked. The objectives (`hydra.sweeper.objectives`, `metric:minimize|maximize`) default to
time/token and the share of greedy tokens that depart from the reference's (decode's divergent_share); with
task=perplexity among the tasks, `kl_mean:minimize` is the KL divergence from the reference.

When the search ends: the trials on the front (no other trial at least as good in every objective and better
in one) are printed and tagged (`search_front` on the sweep's parent, `search_trial` and `on_search_front` on
each trial's runs), and `search.md` and `search.csv` are written in the sweep's directory; the sweep's report
(report_at_end) has its own speed–quality front as any sweep does.

Why not Hydra's Optuna sweeper plugin: hydra-optuna-sweeper 1.2.0, its latest, pins optuna < 3.0 (2.10, from
2021); quantspec uses Optuna 5 directly, through Hydra's own launcher so trials are ordinary jobs.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.override_parser.types import IntervalSweep, Override

from src.assembly.config import ConfigError
from src.assembly.sweep_settings import sweep_of
from src.common.metrics import markdown_table
from src.common.say import say
from src.tracking.store.names import CONFIG_KEY, ROUND, config_key, key_of
from src.tracking.sweep import record
from src.tracking.sweep.naming import field_of, told
from src.tracking.sweep.record import SweepAbort, SweepUnwritable
from src.tracking.sweep.rounds import Rounds, legal, open_sweep_dir, parse_overrides, schedule

log = logging.getLogger("quantspec")

DEFAULT_OBJECTIVES = ("time_per_token_ms_median:minimize", "divergent_share:minimize")
SAMPLERS = ("nsga2", "tpe", "random")
NOT_SEARCHED = ("rounds", "busy_reruns", ROUND, "task")


@dataclass
class Axis:
    key: str
    values: list | None = None  # categorical
    low: float | None = None  # interval
    high: float | None = None
    integer: bool = False

    def suggest(self, trial):
        if self.values is not None:
            return trial.suggest_categorical(self.key, self.values)
        if self.integer:
            return trial.suggest_int(self.key, int(self.low), int(self.high))
        return trial.suggest_float(self.key, self.low, self.high)


@dataclass
class Space:
    axes: list[Axis]
    fixed: list[str]  # overrides every job has
    tasks: list[str]  # each trial runs one job per task (empty: the composed task)


def objectives(specs) -> list[tuple[str, str]]:
    """`metric:minimize` items -> (metric, direction); a bad one is a ConfigError, one line."""
    out = []
    for spec in specs:
        metric, _, direction = str(spec).partition(":")
        direction = direction or "minimize"
        if not metric or direction not in ("minimize", "maximize"):
            raise ConfigError(f"hydra.sweeper.objectives item {spec!r} is not metric:minimize or metric:maximize")
        out.append((metric, direction))
    if not out:
        raise ConfigError("hydra.sweeper.objectives is empty; e.g. [time_per_token_ms_median:minimize]")
    return out


def space(overrides: list[Override]) -> Space:
    """The searched axes, the fixed overrides and the tasks, from the sweep's command line."""
    axes, fixed, tasks = [], [], []
    for o in overrides:
        key = o.get_key_element()
        if key == "task":
            tasks += (
                [str(v) for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.get_value_element_as_str()]
            )
        elif not o.is_sweep_override() or key in NOT_SEARCHED:
            fixed.append(o.input_line)
        elif isinstance(o.value(), IntervalSweep):
            sweep = o.value()
            integer = isinstance(sweep.start, int) and isinstance(sweep.end, int) and "int" in (o.input_line or "")
            low, high = float(sweep.start), float(sweep.end)
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ConfigError(
                    f"{o.input_line}: an interval runs from a lower to a higher finite number "
                    f"(interval({min(low, high):g},{max(low, high):g}))"
                )
            axes.append(Axis(key, low=low, high=high, integer=integer))
        else:
            axes.append(Axis(key, values=list(o.sweep_string_iterator())))
    return Space(axes, fixed, tasks)


@dataclass
class Trial:
    number: int
    params: dict
    jobs: list[list[str]]  # one per task: its overrides
    keys: list[str] = field(default_factory=list)  # each job's override_dirname (its identity across rounds)
    values: list[float] | None = None
    busy: bool = False
    state: str = "running"
    runs: list[str] = field(default_factory=list)  # its jobs' runs, every round
    mads: list[float] = field(default_factory=list)  # each objective's median absolute deviation over rounds
    unlogged: tuple[str, list[str]] | None = None  # an objective its finished jobs do not log, and what they do


def _value(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def _pareto(trials: list[Trial], directions: list[str]) -> list[Trial]:
    done = [t for t in trials if t.values is not None]
    sign = [1 if d == "minimize" else -1 for d in directions]

    def dominates(a: Trial, b: Trial) -> bool:
        pairs = [(s * x, s * y) for s, x, y in zip(sign, a.values, b.values)]
        return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)

    return [t for t in done if not any(dominates(o, t) for o in done if o is not t)]


class Search(Rounds):
    """The work of the `search` sweeper (hydra_plugins.quantspec_search): Optuna asks, the launcher runs each
    trial's jobs in interleaved rounds, the store answers with their figures, Optuna is told."""

    def _abort(self, sweep, reason: str):
        """End the search: its parent closed as failed with the reason (its jobs stay recorded), one line."""
        try:
            store = record.ledger.store_for(sweep)
            parent = store.find_sweep(str(sweep.sweep_dir))
            if parent is not None:
                store.close_sweep(parent.info.run_id, "FAILED", reason)
        except Exception as err:  # noqa: BLE001 - the line below is said either way
            log.warning("the search's parent run was not closed (%s)", type(err).__name__)
        raise SweepAbort(reason)

    def sweep(self, arguments: list[str]):
        import optuna  # optional: the search extra

        sweep, goals, plan = self._plan(parse_overrides(self, arguments))
        sweep_dir = open_sweep_dir(self.config)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        samplers = {
            "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=self.seed, population_size=max(2, self.batch)),
            "tpe": lambda: optuna.samplers.TPESampler(seed=self.seed),
            "random": lambda: optuna.samplers.RandomSampler(seed=self.seed),
        }
        study = optuna.create_study(directions=[d for _, d in goals], sampler=samplers[self.sampler]())
        log.info(
            "search: %d trials of %s, objectives %s, %s",
            self.trials,
            " × ".join(a.key for a in plan.axes),
            ", ".join(f"{m} ({d})" for m, d in goals),
            self.sampler,
        )
        named = [a.key for a in plan.axes if field_of(f"{a.key}=")]  # a group's choice is named already
        trials: list[Trial] = []
        returns, index, first_round = [], 0, 1
        while len(trials) < self.trials:
            asked = [study.ask() for _ in range(min(self.batch, self.trials - len(trials)))]
            batch, measured = [], {tuple(sorted(t.params.items())): t for t in trials if t.values is not None}
            for t in asked:
                params = {a.key: a.suggest(t) for a in plan.axes}
                base = [*plan.fixed, *[f"{k}={_value(v)}" for k, v in params.items()]]
                jobs = [[*base, f"task={task}"] for task in plan.tasks] or [base]
                batch.append(Trial(t.number, params, [told(job, named) for job in jobs]))
            # a configuration already measured is told its figures again, not run again (Optuna proposes
            # repeats, more so over a few categorical axes)
            fresh = [t for t in batch if tuple(sorted(t.params.items())) not in measured]
            if fresh:
                index, first_round = self._measure(fresh, sweep, returns, index, first_round)
            for trial, asked_trial in zip(batch, asked):
                self._tell(study, trial, asked_trial, measured, sweep, goals)
            trials += batch
        self._finish(trials, goals, sweep, sweep_dir)
        return returns

    def _plan(self, overrides: list):
        """The sweep's settings, its objectives and the space to search; a bad one ends the sweep in one line."""
        try:
            sweep = sweep_of(self.config)
            goals = objectives(self.objectives)
            if self.sampler not in SAMPLERS:
                raise ConfigError(f"hydra.sweeper.sampler={self.sampler} is not one of: {', '.join(SAMPLERS)}")
            if self.trials < 1 or self.batch < 1:
                raise ConfigError("hydra.sweeper.trials and hydra.sweeper.batch must be at least 1")
            plan = space(overrides)
        except ConfigError as err:
            raise SweepAbort(str(err)) from None
        if not plan.axes:
            raise SweepAbort(
                "hydra/sweeper=search has nothing to search: give an axis several values "
                "(precision=bf16,w8a8 or draft.k=range(2,7) or precision.alpha=interval(0.3,0.9))"
            )
        return sweep, goals, plan

    def _tell(self, study, trial: Trial, asked_trial, measured: dict, sweep, goals) -> None:
        """Optuna told the trial's figures (read from the store, or an earlier trial's for a repeat)."""
        import optuna  # optional: the search extra

        earlier = measured.get(tuple(sorted(trial.params.items())))
        if earlier is not None:
            trial.values, trial.busy, trial.mads = earlier.values, earlier.busy, earlier.mads
            trial.state = f"as trial {earlier.number}"
        else:
            self._read(trial, sweep, goals)
        if trial.unlogged:  # finished jobs without an objective: every later trial would miss it too
            self._abort(
                sweep,
                f"hydra.sweeper.objectives names {trial.unlogged[0]}, which the trial's finished jobs do not "
                f"log (they log {', '.join(trial.unlogged[1][:6])}, ...); name a metric they log",
            )
        if trial.values is None:
            study.tell(asked_trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(asked_trial, trial.values)
        log.info(
            "trial %d %s: %s",
            trial.number,
            trial.params,
            trial.state
            if trial.values is None
            else ", ".join(f"{m} {v:.4g}" for (m, _), v in zip(goals, trial.values))
            + (" [every round busy]" if trial.busy else ""),
        )

    def _measure(self, batch: list[Trial], sweep, returns: list, index: int, first_round: int) -> tuple[int, int]:
        """The batch's jobs in `rounds` interleaved rounds (rotated; round numbers go on from the last batch's),
        a round with a busy job measured again up to busy_reruns times."""
        jobs = [job for trial in batch for job in trial.jobs]
        done = busy = 0
        while True:
            r = first_round + done
            (order,) = schedule(jobs, 1, first=r)
            if not done:  # composed once: its later rounds differ only by their `round`
                legal(self, order)
            try:  # Hydra makes each job's folder and writes its config before the job runs
                results = self.launcher.launch(order, initial_job_idx=index)
            except OSError as err:
                raise SweepUnwritable(err) from None
            index += len(order)
            returns.append(results)
            for job, result in zip(order, results):
                _ = result.return_value  # a job's own error is raised here, as Hydra's sweepers do
                key = config_key(str(result.hydra_cfg.hydra.job.override_dirname)) if result.hydra_cfg else ""
                plain = [o for o in job if not o.startswith(f"{ROUND}=")]
                for trial in batch:
                    if plain in trial.jobs and key and key not in trial.keys:
                        trial.keys.append(key)
            finished = any(result.return_value == "finished" for result in results)
            done += 1
            busy += finished and self._busy(sweep, r)
            if done - busy >= sweep.rounds or done >= sweep.rounds + sweep.busy_reruns:
                return index, first_round + done

    def _read(self, trial: Trial, sweep, goals) -> None:
        """The trial's objectives from the store: each the median over its quiet rounds (all, marked, where
        every round was busy), from the first of its jobs that has it."""
        store = record.ledger.store_for(sweep)
        parent = store.find_sweep(str(sweep.sweep_dir))
        if parent is None:  # no job of the search has run yet: every one so far was refused by its config
            trial.state = "refused by its config (said above)"
            return
        runs = []
        for key in trial.keys:
            runs += store.search(
                f"tags.mlflow.parentRunId = '{parent.info.run_id}' and "
                f"tags.`{CONFIG_KEY}` = '{key_of(key)}' and tags.outcome = 'finished'"
            )
        values = []
        for metric, _ in goals:
            have = [
                (r.data.metrics[metric], r.data.tags.get("host_busy") == "true")
                for r in runs
                if metric in r.data.metrics and not math.isnan(r.data.metrics[metric])
            ]
            quiet = [v for v, b in have if not b]
            if not have:
                trial.state = f"no {metric} (its jobs did not finish, or none logs it)"
                if runs and not any(metric in r.data.metrics for r in runs):
                    trial.unlogged = (metric, sorted({m for r in runs for m in r.data.metrics}))
                return
            trial.busy |= not quiet
            used = quiet or [v for v, _ in have]
            values.append(statistics.median(used))
            trial.mads.append(statistics.median(abs(v - values[-1]) for v in used))
        for r in runs:
            store.set_tags(r.info.run_id, {"search_trial": str(trial.number)})
        trial.values, trial.state, trial.runs = values, "finished", [r.info.run_id for r in runs]

    def _finish(self, trials: list[Trial], goals, sweep, sweep_dir: Path) -> None:
        front = _pareto(trials, [d for _, d in goals])
        keys = sorted({k for t in trials for k in t.params})
        head = ["trial", *keys, *[f"{m} ({d[:3]}), median ± MAD over rounds" for m, d in goals], "on the front"]
        rows = [
            [
                t.number,
                *[t.params.get(k, "") for k in keys],
                *(
                    [f"{v:.4g} ± {mad:.2g}" for v, mad in zip(t.values, t.mads)]
                    if t.values
                    else [t.state] + [""] * (len(goals) - 1)
                ),
                " ".join(
                    x
                    for x in (
                        "★" if t in front else "",
                        "[every round busy]" if t.busy else "",
                        f"({t.state})" if t.state.startswith("as trial") else "",
                    )
                    if x
                ),
            ]
            for t in trials
        ]
        table = markdown_table(head, rows)
        (sweep_dir / "search.md").write_text(f"# Search: {len(trials)} trials, {len(front)} on the front\n\n{table}\n")
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(head)
        writer.writerows(rows)
        (sweep_dir / "search.csv").write_text(out.getvalue())
        print()
        say(
            f"search done, {len(front)} of {len(trials)} trials on the front ({', '.join(m for m, _ in goals)}):\n{table}\n"
        )
        try:
            store = record.ledger.store_for(sweep)
            parent = store.find_sweep(str(sweep.sweep_dir))
            if parent is None:  # every trial refused by its config: no run to tag
                return
            store.set_tags(
                parent.info.run_id,
                {
                    "search_front": "; ".join(
                        f"trial {t.number}: " + ", ".join(f"{k}={v}" for k, v in t.params.items()) for t in front
                    )
                },
            )
            for t in trials:
                for run_id in t.runs:
                    store.set_tags(run_id, {"on_search_front": "true" if t in front else "false"})
        except Exception as err:  # noqa: BLE001 - the table and files are written; the tags are extra
            log.warning("the search's front was not tagged in the store (%s)", type(err).__name__)
