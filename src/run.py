"""Entry point: the Hydra glue. Composes each job's config and hands it to src.tracking.sweep.record, which runs
and records it; closes the sweep's parent; turns signals and aborts into one line and an exit code.

    python -m src.run                                   # one job on the defaults
    python -m src.run -m hardware=phx,stx precision=fp32,bf16   # a sweep: one MLflow parent, a child per job
    python -m src.run -m precision=fp32,bf16,w8a8 rounds=3      # each job timed in 3 interleaved rounds
    python -m src.run -m ... hydra.sweep.dir=<a sweep's directory>   # resume it: finished jobs are kept
    python -m src.run --cfg job precision=w8a8          # print the composed config, run nothing

Arguments are Hydra overrides: group=choice (model, hardware, precision, draft, task, engine, dataset,
tracking; `a,b` sweeps with -m) and field=value for any field (docs: reference/config.md). Exit 0 when every
job finished or was skipped, 1 when one failed or was killed, 2 for a command line refused in one line,
128 + the signal when stopped.

Hydra's config is converted here and only here: a job's, once at its start, into typed dataclasses
(src.assembly.config.JobConfig; the job itself, src.assembly.job, sees nothing else), and the sweep's
own settings (store, experiment, resume, report, rounds) by `src.assembly.sweep_settings.sweep_of`, for the sweeper
(src.tracking.sweep.rounds), the Ray launcher (src/cluster.py) and the sweep callback below.
"""

from __future__ import annotations

from src.common import startup  # first: the collector paused for the imports below

# isort: split
import hashlib
import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue
from transformers.utils import logging as hf_logging

from src.assembly import ownmodel
from src.assembly.overrides import CONF_DIR, composition_problem, unparsable
from src.assembly.sweep_settings import sweep_of, unset_line
from src.common import envvars, signals
from src.common.locks import hold
from src.common.paths import unwritable
from src.common.progress import watched
from src.common.say import message_line, say
from src.common.schema import ConfigError
from src.common.signals import Stopped
from src.tracking.readback import reporting as report
from src.tracking.store.locks import replay_lock
from src.tracking.store.names import SWEEP_ID, SweepInfo, bound_http_retries, quiet_store_logs
from src.tracking.sweep import record
from src.tracking.sweep.naming import VARIES, job_name
from src.tracking.sweep.record import SweepAbort, SweepUnwritable

startup.imported()

# Two sweeps started in the same second must not share a directory (and so a parent run): the default
# sweep directory ends in the sweeping process's id. Cached: every job of the sweep sees one value.
OmegaConf.register_new_resolver("quantspec_pid", lambda: str(os.getpid()), use_cache=True, replace=True)


def short_dirname(name: str, limit: int = 120) -> str:
    """A job's directory name from its overrides: one path component whatever the user wrote (a '/' or a
    control character becomes '_', so `experiment=../../x` stays inside the sweep directory), cut (with a
    hash of the whole, so it stays unique) where many overrides would pass the file system's 255-byte
    limit on a name, and also marked with that hash wherever a character was replaced."""
    safe = "".join("_" if c in "/\\" or not c.isprintable() else c for c in name)
    if safe in ("", ".", ".."):
        safe = f"_{safe}"
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    if len(safe.encode()) <= limit:
        return safe if safe == name else f"{safe}-{digest}"
    return f"{safe.encode()[: limit - 17].decode(errors='ignore')}-{digest}"


OmegaConf.register_new_resolver("quantspec_dirname", lambda name: short_dirname(str(name)), replace=True)


def sweep_info(hc):
    if hc.mode != RunMode.MULTIRUN:
        return None
    sweep_dir = Path(hc.sweep.dir).resolve()
    # The default layout is multirun/<date>/<time>-<pid>; a named sweep directory names itself.
    name = f"{sweep_dir.parent.name} {sweep_dir.name}" if sweep_dir.parent.parent.name == "multirun" else sweep_dir.name
    # The sweep's own command line (hc.overrides.task is one job's share of it).
    return SweepInfo(
        str(sweep_dir), f"sweep {name}", " ".join(a for a in sys.argv[1:] if a not in ("-m", "--multirun"))
    )


def task(cfg: DictConfig, preset: tuple[str, str] | None = None, node: dict | None = None) -> str:
    """One job, as Hydra's launchers call it (here, or on a Ray worker: src.cluster). `preset` records the
    job with that (outcome, reason) without running it: a launcher that could not place it says why.
    `node`: where it runs (src.cluster's worker names its Ray node); this host otherwise."""
    hc = HydraConfig.get()
    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        record.ledger.refuse(hc.job.override_dirname, unset_line(err))
        return "failed"
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra") and v is not None}
    try:  # a model of one's own: its family read from its config, where it runs (here, or on the Ray worker)
        raw, choices = ownmodel.resolve(raw, choices)
    except ConfigError as err:
        record.ledger.refuse(hc.job.override_dirname, str(err))
        return "failed"
    # named by its choices and the fields its sweep varies, as the sweeper told it (src.tracking.sweep.naming)
    name = job_name(choices, list(hc.overrides.task), hc.job.env_set.get(VARIES, ""))
    return record.run_job(
        raw, choices, sweep_info(hc), hc.job.override_dirname, Path(hc.runtime.output_dir), preset, node, name
    )


# An absolute path: Hydra resolves a relative one against the calling module, which differs between
# `python -m src.run` and an import.
main = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(task)


SWEEP_LOCK = ".quantspec-sweep.lock"


class SweepCallback(Callback):
    """Holds the sweep directory while its jobs run (a second process into the same directory refuses in one
    line), and closes the sweep's parent run once every job has run, with the job counts the store holds."""

    held: int | None = None  # the sweep directory's lock, from the sweep's start to its end

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        try:
            held = hold(sweep_dir / SWEEP_LOCK)
        except OSError as err:  # a full or read-only file system: Hydra would only warn of a callback's error
            raise SweepUnwritable(OSError(err.errno, err.strerror, str(sweep_dir))) from None
        if isinstance(held, str):
            raise SweepAbort(
                f"the sweep directory {sweep_dir} is in use by {held}; wait for it to end (then "
                f"rerunning into it resumes the sweep) or choose another hydra.sweep.dir"
            )
        self.held = held

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        try:
            self._end(config)
        finally:  # the sweep's directory is free once its sweep has ended (a process that dies frees it too)
            held, self.held = self.held, None
            if held is not None:
                os.close(held)

    def _end(self, config: DictConfig) -> None:
        ledger = record.ledger
        counts = {o: ledger.outcomes.count(o) for o in ("finished", "skipped", "failed", "killed")}
        if ledger.outcomes and len(ledger.refused) == len(ledger.outcomes):
            # every job was refused by its config (said above): no run exists, nothing to close or report
            say(
                f"sweep done: all {len(ledger.refused)} jobs refused by their config before a run (said above)",
            )
            return
        try:
            sweep = sweep_of(config)
            store = ledger.store_for(sweep)
            parent = store.find_sweep(str(sweep.sweep_dir))
            if parent is not None:
                with replay_lock(store.uri):  # not while a sync here sends this sweep's journaled jobs
                    counts = store.close_sweep(parent.info.run_id)
                ledger.counts.update(counts)
                if sweep.report_at_end:
                    report.at_sweep_end(store.uri, sweep.experiment, parent.data.tags[SWEEP_ID])
        except Exception as err:  # noqa: BLE001 - the jobs are recorded; the next run closes the parent
            say(
                f"could not close the sweep's parent run ({message_line(err).split(' with exception')[0]}); the next run will",
                err=True,
            )
        say(
            f"sweep done: {counts['finished']} finished, {counts['skipped']} skipped, {counts['failed']} failed"
            + (f", {counts['killed']} killed" if counts.get("killed") else "")
            + (f"; {len(ledger.refused)} refused by their config before a run (said above)" if ledger.refused else "")
        )


def unwritable_output(argv: list[str]) -> str | None:
    """Why the folder the command writes its jobs' files in cannot be written (it is made here, as Hydra would
    make it, before any work: Hydra's own failure there is a traceback), or None. The part of a path before its
    first interpolation (the default's ${now:...}) is what is checked."""
    if {"--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i"} & set(argv):
        return None  # prints, writes nothing
    multirun = "-m" in argv or "--multirun" in argv
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = next((a.partition("=")[2] for a in argv if a.partition("=")[0].lstrip("+") == key), None)
    folder = Path((given or ("multirun" if multirun else "outputs")).split("${")[0] or ".").expanduser()
    return unwritable(folder, f"{key}={given}" if given else f"{key} (its default under {folder})")


def cli() -> None:
    signals.install()  # first: a stop while the command line is checked is one line too
    startup.detach_stdin()  # no job, and nothing a job loads, reads a question's answer from it
    try:
        _cli()
    except (KeyboardInterrupt, Stopped) as err:
        sys.exit(record.stopped(err))
    finally:  # all is recorded: a stop during the interpreter's teardown (seconds) had killed it with no word
        signals.stopping()  # ignored, which Python's teardown keeps (it resets only handlers of its own)


def _cli() -> None:
    problem = unparsable(sys.argv[1:]) or composition_problem(sys.argv[1:])
    # a stop that landed inside Hydra's composition comes back wrapped as a composition error (its key `defaults`):
    # the stop, not that error, is what happened (the stop-anywhere test caught SIGTERM there, said as bad YAML)
    signals.check()
    try:
        envvars.check()  # before any job: a variable read mid-run (the heartbeat's) would fail it there
    except envvars.EnvError as err:
        problem = problem or str(err)
    problem = problem or unwritable_output(sys.argv[1:])
    if problem:
        say(problem, err=True)
        sys.exit(2)
    # Library chatter would bury the tables; our own log lines stay at INFO. Set here and in the environment
    # (a runtime's process, src.engine.runtimes.isolated, imports transformers afresh), unless the user chose a level.
    if "TRANSFORMERS_VERBOSITY" not in os.environ:
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"
        hf_logging.set_verbosity_error()
    if not watched():  # transformers' own bars (GGUF conversion, weight loading) too
        hf_logging.disable_progress_bar()
    bound_http_retries()
    quiet_store_logs()
    try:
        main()
    except BrokenPipeError:  # the output's reader went away (`| head`): nothing more can be said there
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except SweepAbort as err:
        signals.check()  # an abort a stop caused (it landed inside what the abort reports) is the stop
        say(str(err), err=True)
        sys.exit(2)
    except SweepUnwritable as err:  # Hydra writing a job's folder: read-only, immutable, full
        sys.exit(record.unwritable(err.error))
    except OSError as err:  # the sweep's own directory, before any job (its lock, multirun.yaml)
        sys.exit(record.unwritable(err))
    # A sweep's outcome is the store's (its jobs may have run in other processes, on other machines).
    counts = record.ledger.counts
    failed = counts.get("failed", 0) + counts.get("killed", 0) if counts else 0
    sys.exit(1 if failed or {"failed", "killed"} & set(record.ledger.outcomes) else 0)


if __name__ == "__main__":
    # Hydra imports SweepCallback from `src.run`; running that same module (not this `__main__` copy)
    # keeps one record of job outcomes for the callback and the exit code.
    from src import run as entry

    entry.cli()
