"""One job, tracked: a config error is one line and no run; otherwise the job's run is opened in the
store (after a resume check), everything it measures is journaled and logged as it comes, and it ends
finished, skipped, failed or killed. The job itself is src.assembly.job's; Hydra is src.run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import socket
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from src.assembly import job as jobs
from src.assembly.config import ConfigError, job_config_from_dict, reads_dataset
from src.common import latency, peakmemory, renames, signals, sysmetrics
from src.common.axes import AXES
from src.common.environment import host_state
from src.common.jsonable import jsonable
from src.common.metrics import EXAMPLE, rows_csv, seed_table, summary_table
from src.common.say import message_line, say
from src.common.signals import Stopped
from src.tracking.store.experiment import Store, open_store
from src.tracking.store.jobrun import JobRun
from src.tracking.store.journal import Journal
from src.tracking.store.names import (
    CONFIG_HASH,
    CONFIG_KEY,
    ROUND,
    StoreUnreachable,
    default_uri,
    first_line,
    flatten,
    key_of,
)
from src.tracking.store.names import config_key as rounds_config_key
from src.tracking.sweep.naming import job_name

log = logging.getLogger("quantspec")


class SweepAbort(BaseException):
    """The sweep cannot go on (no tracking store): a BaseException, so Hydra does not run every other job
    into the same wall first. The message is the one line the user sees."""


@dataclass
class Ledger:
    """What this process saw of its sweep's jobs, for its summary line, its exit code and a signal's
    clean-up. Hydra calls each job as a bare function (`src.run.task`) and its callback apart, so this
    one object per process carries it between them; it holds outcomes, never a job's settings."""

    outcomes: list[str] = field(default_factory=list)  # one per job run by this process
    refused: list[str] = field(default_factory=list)  # jobs whose config was refused before any run existed
    said: set[str] = field(default_factory=set)  # config errors said already (a sweep repeats them)
    counts: dict[str, int] = field(default_factory=dict)  # the sweep's job counts as the store holds them
    store: object = None  # the store, sweep and job run under way: closed when a signal stops us
    sweep: object = None
    job: object = None

    def refuse(self, name: str, message: str) -> None:
        """A job whose config was refused: one line, said once per sweep."""
        if message not in self.said:
            self.said.add(message)
            say(message, err=True)
        self.outcomes.append("failed")
        self.refused.append(name)

    def store_for(self, sweep):
        """The store of the sweep (src.assembly.config.SweepSettings): the open one where a job opened it."""
        return self.store or Store(sweep.tracking.uri or default_uri(), sweep.experiment)


ledger = Ledger()
LOCAL = {"node": "local", "node_host": socket.gethostname()}  # where a job runs outside a Ray cluster


def _close_sweep(status: str, reason: str, then: str) -> str:
    """Close this process's sweep (its parent, with the store's counts) as `status` for `reason`; what to add
    to the one line that says so (`then`: how to go on), or '' where no sweep is open here."""
    store, sweep = ledger.store, ledger.sweep
    if store is None or sweep is None:
        return ""
    try:
        parent = store.find_sweep(sweep.sweep_id)
        counts = store.close_sweep(parent.info.run_id, status, reason) if parent else {}
    except Exception as close_err:  # noqa: BLE001 - the next run closes it from its owner record
        return f"; the sweep's parent stays open until the next run ({type(close_err).__name__})"
    closed = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "no jobs"
    return f"; sweep closed ({closed}); {then.format(sweep_dir=sweep.sweep_id)}"


def stopped(err: BaseException) -> int:
    """A signal ended the process: close what is open, say so in one line, and return the exit code."""
    signals.stopping()
    reason, code = signals.describe(err)
    said = reason
    if ledger.job is not None and ledger.job.outcome == "killed":
        said += "; the job under way is recorded as killed"
    said += _close_sweep("KILLED", reason, "resume with hydra.sweep.dir={sweep_dir}")
    say(said, err=True)
    return code


class SweepUnwritable(BaseException):
    """The sweep's directory could not be written (Hydra makes each job's folder and config there before the
    job runs): carried past Hydra's own handler, which would print it as a traceback, to src.run."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def unwritable(err: OSError) -> int:
    """The sweep's own files could not be written (its directory made read-only or immutable, a full file
    system): close the sweep's parent as failed with the reason, say so in one line, exit 1. Every job that
    ran is recorded; the rest never started."""
    what = f"{err.strerror or type(err).__name__}{f': {err.filename}' if err.filename else ''}"
    said = f"the sweep stopped: it could not write its files ({what})"
    closed = _close_sweep(
        "FAILED",
        f"could not write its files ({what})",
        "make it writable (or free space) and rerun with hydra.sweep.dir={sweep_dir} to resume",
    )
    # before any job: nothing was recorded
    said += closed or "; no job ran: free space or make it writable (or choose another hydra.sweep.dir) and rerun"
    say(said, err=True)
    return 1


def run_job(
    raw: dict,
    choices: dict[str, str],
    sweep,
    job_key: str = "",
    output_dir: Path | None = None,
    preset: tuple[str, str] | None = None,
    node: dict | None = None,
    name: str = "",
) -> str:
    """Run one composed job and record it, as `name` (src.tracking.sweep.naming; its choices where not given).
    Returns its outcome: finished, skipped, failed or killed.

    A config error is one line and no run. A job a previous attempt of the same sweep finished is kept,
    not rerun (resume=false reruns it). Everything measured is journaled in `output_dir` as it is
    logged, so a store that fails mid-job loses nothing."""
    signals.check()  # a stop dropped inside a library callback ends the sweep here, before another job starts
    name = name or job_name(choices, [])
    if raw.get("round", 1) != 1:  # src.tracking.sweep.rounds: a later round of the same job, its own run
        name += f" round {raw['round']}"
    try:
        cfg = job_config_from_dict(raw)
    except ConfigError as err:
        ledger.refuse(name, str(err))
        return "failed"
    uri = cfg.tracking.uri or default_uri()
    registry = cfg.cache_dir / "journals"
    try:
        store = open_store(uri, cfg.experiment, registry, cfg.tracking.unreachable == "journal")
    except StoreUnreachable as err:
        raise SweepAbort(str(err)) from None
    ledger.store, ledger.sweep, ledger.job = store, sweep, None
    # the job across its rounds (src.tracking.sweep.rounds), and this round of it (every round is its own run)
    config_key, job_key = key_of(rounds_config_key(job_key) or name), key_of(job_key or name)
    params = _params(raw, choices)
    if sweep and store and cfg.resume and _kept(store, sweep, job_key, name, params):
        ledger.outcomes.append("finished")
        return "finished"
    job = JobRun(store, _journal(output_dir, job_key, registry, uri), uri, cfg.experiment)
    ledger.job = job
    # what can change a figure on the same code, for comparing sweeps (src.tracking.readback.regression); not part
    # of the job's identity (resume compares the config above)
    host = {f"host.{k}": v for k, v in host_state().items()}
    tags = {**{g: choices.get(g, "?") for g in AXES}, **(node or LOCAL), ROUND: str(raw.get(ROUND, 1))}

    def work() -> None:
        job.start(name, sweep, {**params, **host}, {**tags, CONFIG_KEY: config_key}, job_key)
        if preset is not None:
            _record_preset(job, name, *preset)
        else:
            _execute(cfg, raw, job, name)

    _tracked(job, name, work)
    return job.outcome or "failed"


def _params(raw: dict, choices: dict[str, str]) -> dict:
    """The job's params: its composed config flattened, its choices, and the config's digest. A dataset the job
    does not read (a decode's, with no calibration) is left out: what the run records is what it ran on."""
    if not reads_dataset(raw):
        raw = {k: v for k, v in raw.items() if k != "dataset"}
        choices = {k: v for k, v in choices.items() if k != "dataset"}
    params = {
        **flatten({k: v for k, v in raw.items() if k != "hydra"}),
        # a nested choice (precision@draft.precision) by its place: MLflow keys allow no '@'
        **{f"choice.{k.rpartition('@')[2]}": v for k, v in choices.items()},
    }
    params[CONFIG_HASH] = config_hash(raw)
    return params


def _kept(store, sweep, job_key: str, name: str, params: dict) -> bool:
    """Whether a previous attempt of this sweep finished this job with this config (then it is kept, said)."""
    done = store.finished_job(sweep.sweep_id, job_key)
    if done is None:
        return False
    changed = _changed(done.data.params, params)
    if not changed:
        say(
            f"job {name} already finished in this sweep (run {done.info.run_id}); kept (resume=false reruns it)",
        )
        return True
    say(
        f"job {name} finished in this sweep (run {done.info.run_id}) with another config ({changed}); rerunning it",
    )
    return False


def _journal(output_dir: Path | None, job_key: str, registry: Path, uri: str) -> Journal | None:
    """The job's journal in its output directory, or None (said) where it cannot be written."""
    try:
        return Journal(output_dir or Path("outputs") / "journals" / job_key, registry, uri)
    except OSError as err:
        log.warning("cannot write a journal (%s); results go to the store only", err)
        return None


def _unwrapped(work) -> None:
    """work(), where a stop that a library caught and raised again as an error of its own (Hydra's composition,
    OmegaConf's `except Exception` wrappers) is raised as the stop: the job was killed, it did not fail."""
    try:
        work()
    except Exception:
        signals.check()
        raise


def _tracked(job: JobRun, name: str, work) -> None:
    """Do the job's work (its run's start first); whatever ends it (a signal, an error, a lost store) is
    recorded on the run and said in one line."""
    try:
        _unwrapped(work)
    except (KeyboardInterrupt, Stopped) as err:
        signals.stopping()
        try:
            job.kill(signals.describe(err)[0] + _so_far(job))
        except StoreUnreachable:
            pass  # nothing can record it; the owner record lets the next run end it
        raise
    except Exception as err:  # noqa: BLE001 - recorded in full (error.txt) and reported in one line
        say(f"job {name} failed: {message_line(err, empty=type(err).__name__)}", err=True)
        try:
            job.fail(err, _so_far(job))
        except StoreUnreachable as lost:
            say(f"job {name}: {lost}", err=True)
        except Exception as answer:  # noqa: BLE001 - the store refused the failure's record: say so, go on
            say(f"job {name}: the store refused its failure record ({first_line(answer)})", err=True)
    finally:
        ledger.outcomes.append(job.outcome or "failed")
        if job.where():
            say(
                f"job {name}: the tracking store failed ({job.offline}); its results are journaled in "
                f"{job.where()} and go to the store with the next run or `python -m src.sync`",
                err=True,
            )


# The figures a task exists to give: NaN in one of these fails the job (its other figures stay logged).
HEADLINE = ("time_per_token_ms_median", "prefill_ms_median", "perplexity", "kl_mean", "accuracy", "pass_at_1")


# Settings that change where a job is recorded, where its builds are cached (each machine of a lab has
# its own cache) or whether it runs again: not what it measures.
# How many rounds a sweep asks for does not change what one round measures.
NOT_HASHED = ("hydra", "resume", "report_at_end", "tracking", "cache_dir", "rounds", "busy_reruns")


def config_hash(raw: dict) -> str:
    """The job's resolved config, as one digest: a resumed sweep reruns a job whose config changed."""
    kept = {k: v for k, v in raw.items() if k not in NOT_HASHED}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _changed(old: dict[str, str], new: dict[str, str]) -> str:
    """Why a finished run's config differs from this job's ('' if it does not): the values that moved."""
    if old.get(CONFIG_HASH) == new[CONFIG_HASH]:
        return ""
    if CONFIG_HASH not in old:
        return "its run predates config hashes"
    now = renames.current(old)  # a run recorded before a rename: its config under today's names
    # the composed config's own keys only: a run also holds what its job logged (executed.*, ...)
    moved = sorted(k for k in new if k != CONFIG_HASH and not k.startswith(NOT_HASHED) and now.get(k) != new[k])
    if not moved and now != old:
        return ""  # the same config, recorded under the names it had then
    shown = ", ".join(f"{k}: {now.get(k, '-')} -> {new.get(k, '-')}" for k in moved[:3])
    return shown + (f" and {len(moved) - 3} more" if len(moved) > 3 else "") if moved else "its config hash differs"


def _so_far(job) -> str:
    """What a job that stopped early had measured (its rows are in the store or journal already)."""
    done, total = job.measured
    return f"; stopped after {done} of {total} examples (their rows are kept)" if total else ""


def _record_preset(job, name: str, outcome: str, reason: str) -> None:
    if outcome == "skipped":
        job.skip(reason)
        say(f"job {name} skipped: {reason}")
    else:
        job.fail(RuntimeError(reason))
        say(f"job {name} failed: {reason}", err=True)


def _flag_busy_host(run, others_cores: float | None, limit: float) -> None:
    """A timing taken while other processes used the CPU is kept, tagged and said: noisy, not hidden."""
    if others_cores is None:
        return  # nothing timed, or too briefly to tell
    busy = others_cores > limit
    run.set_tags({"host_busy": str(busy).lower(), "host_busy_others_cores": f"{others_cores:.2f}"})
    if busy:
        log.warning(
            "host busy: other processes used %.2f cores on average while this job was timed "
            "(tracking.busy_cores=%g); its timings are noisy",
            others_cores,
            limit,
        )


RESULT_JSON = "result.json"
RESULT_FORMAT = "quantspec.job/1"
# also written to the job's own folder, beside run.log and journal.jsonl (as llama-bench's -o json and vLLM's
# --save-result leave a file): what a script around a sweep reads without MLflow
BESIDE = (RESULT_JSON, latency.ARTIFACT)


def job_json(name: str, raw: dict, job, result) -> str:
    """The job's result as one JSON document (result.json): what a script or a dashboard reads without MLflow's
    API. Its config, the host as it saw it, each example's row, every figure it measured (latency percentiles,
    memory, quality: the run's summary metrics), the quantization's own figures and its tags; NaN is null."""
    return json.dumps(
        jsonable(
            {
                "format": RESULT_FORMAT,
                "name": name,
                "config": {k: v for k, v in raw.items() if k != "hydra"},
                "environment": job.env,
                "executed_on": job.placement.executed_on,
                "rows": [dataclasses.asdict(row) for row in result.rows],
                "summary": result.summary,
                "quantization": job.quant_metrics,
                "tags": result.tags,
            }
        ),
        indent=2,
        sort_keys=True,
    )


def _execute(cfg, raw: dict, run, name: str) -> None:
    """Build the job, run its task, print its table, log what it measured, end the run."""

    run.log_text(OmegaConf.to_yaml(OmegaConf.create(raw)), "config.yaml")
    reason = cfg.unsupported_reason()
    if reason:
        run.skip(reason)
        say(f"job {name} skipped: {reason}")
        return
    logged: set[int] = set()

    def keep(row, total: int) -> None:
        """Each example's row to the journal and store as it is measured: a job stopped later keeps it."""
        run.log_metrics(row.metrics(), step=row.example)
        logged.add(row.example)
        run.measured = (len(logged), total)
        signals.check()  # the row is kept: a stop dropped inside a library callback ends the job here

    sampled = sysmetrics.Sampler(lambda values, step: run.log_metrics(values, step=step), cfg.tracking.system_metrics_s)
    with sampled, peakmemory.Peak() as peak:  # its children's memory too: another runtime runs in one
        job = jobs.build(cfg, run)
        job.on_row = keep
        result = job.run()
    result.summary.update(peak.figures())
    _flag_busy_host(run, result.summary.get("others_cpu_cores"), cfg.tracking.busy_cores)
    # The table first: whatever happens to the store below, the user has seen the measurements.
    table = seed_table(result.rows) if result.rows else summary_table({**job.quant_metrics, **result.summary})
    print(f"\n{name} (executed on {job.placement.executed_on})\n{table}\n", flush=True)
    # the rows not logged yet (tasks that measure outside src.tasks.timed.measure), each example's derived
    # figures and the summary: measured by now, so one record, one store call
    points = [(k, v, row.example) for row in result.rows if row.example not in logged for k, v in row.metrics().items()]
    for metric, values in result.series.items():  # per example, unless the task named its own prefix
        key = metric if "/" in metric else EXAMPLE + metric
        points += [(key, value, step) for step, value in enumerate(values, start=1)]
    run.log_points([*points, *((k, v, 0) for k, v in result.summary.items())])
    if result.tags:
        run.set_tags(result.tags)
    if result.rows:
        run.log_text(table + "\n", "examples.md")
        run.log_text(rows_csv(result.rows), "examples.csv")
    for file_name, text in result.artifacts.items():
        run.log_text(text, file_name, beside=file_name in BESIDE)
    run.log_text(job_json(name, raw, job, result), RESULT_JSON, beside=True)
    for note in result.notes:
        log.warning(note)
    if result.notes:  # kept with the run, not only on the console
        run.log_text("\n".join(result.notes) + "\n", "notes.txt")
    # A headline figure that came back NaN (a damaged export, a numeric fault) is no result: the job fails
    # with its reason, after everything it measured is logged, rather than finishing with nothing to show.
    nan = [k for k in HEADLINE if isinstance(result.summary.get(k), float) and math.isnan(result.summary[k])]
    if nan:
        raise RuntimeError(
            f"its {', '.join(nan)} came back NaN (a damaged model or runtime export, or a numeric "
            f"fault); what it measured is kept in its run"
        )
    run.finish()
