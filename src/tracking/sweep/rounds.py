"""Interleaved rounds: `rounds=N` measures each job of a sweep N times, round by round, so that every
speedup is a ratio of two jobs timed under the same conditions (the same round), repeated.

Round r runs every job once, in the sweep's order rotated by r - 1: over N rounds of N jobs each job
takes every position once, so whatever drifts along a round (the page cache, the clock, a neighbour's
load) does not favour one job. Each round of a job is its own run (its own journal, resume and
outcome): round 1 is the job as a sweep without rounds runs it (override_dirname unchanged), later
rounds add `round=r`. Every round loads its model afresh in the same process; the first round of a
quantized precision quantizes and caches it (safetensors + JSON), later rounds load that cache, and
every round warms up before it times (task.warmup), so no round is timed cold.

A round in which any job was timed on a busy host (host_busy: tracking.busy_cores) is measured again as
a whole round, up to `busy_reruns` more rounds, and so is a one-round sweep's only round: a speedup whose
baseline was timed while a neighbour ran reads as a gain of the job's (a busy fp32 baseline made bf16 look
2.91x where its quiet twin gave 1.74x), so by default it is measured again, at the cost of the busy round's
time, rather than only marked. The report leaves out every ratio taken while either of its jobs was busy
where a quiet round remains, and marks the rest BUSY (src.tracking.readback.compare, src.tracking.readback.reporting).
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from hydra.types import HydraContext
from omegaconf import OmegaConf

from src.assembly.config import ConfigError
from src.assembly.sweep_settings import sweep_of
from src.common import signals
from src.common.say import message_line, say
from src.tracking.store.names import ROUND
from src.tracking.sweep import record
from src.tracking.sweep.naming import told, varying
from src.tracking.sweep.record import SweepAbort, SweepUnwritable

log = logging.getLogger("quantspec")


def schedule(jobs: list[list[str]], rounds: int, first: int = 1) -> list[list[list[str]]]:
    """Rounds `first`..`first + rounds - 1` of `jobs` (each a job's overrides): round r rotated by r - 1,
    round 1 as given, later rounds with `round=r` added."""
    out = []
    for r in range(first, first + rounds):
        shift = (r - 1) % len(jobs) if jobs else 0
        order = jobs[shift:] + jobs[:shift]
        out.append([list(job) if r == 1 else [*job, f"{ROUND}={r}"] for job in order])
    return out


def _parts(batch: list[list[str]], size: int | None) -> list[list[list[str]]]:
    """A round's jobs in launches of at most `size` (hydra.sweeper.max_batch_size; None: one launch)."""
    return [batch[i : i + size] for i in range(0, len(batch), size)] if size else [batch]


def open_sweep_dir(config) -> Path:
    """Make the sweep's directory and write its multirun.yaml, as Hydra's own sweeper does; a full or
    read-only file system is SweepUnwritable (one line from src.run), where Hydra would print a traceback."""
    sweep_dir = Path(config.hydra.sweep.dir)
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(config, sweep_dir / "multirun.yaml")
    except OSError as err:
        raise SweepUnwritable(err if err.filename else OSError(err.errno, err.strerror, str(sweep_dir))) from None
    return sweep_dir


def parse_overrides(sweeper, arguments: list[str]) -> list:
    """The sweep's overrides (its config's and the command line's) as Hydra parses them; `rounds`,
    `busy_reruns` and `round` take one value, not a sweep."""
    parser = OverridesParser.create(config_loader=sweeper.hydra_context.config_loader)
    overrides = parser.parse_overrides([*sweeper._parse_config(), *arguments])
    for o in overrides:
        if o.get_key_element() in ("rounds", "busy_reruns", ROUND) and o.is_sweep_override():
            raise SweepAbort(f"{o.get_key_element()} takes one value, not a sweep ({o.input_line}); e.g. rounds=3")
    return overrides


class Precomposed:
    """The sweep's config loader (Hydra's, wrapped by Rounds.setup), holding the jobs legal() composed ahead: the
    launcher takes each from here instead of composing it again (a composition is ~0.35 s here, as long as a tiny
    model's whole job). Anything else is Hydra's loader's own."""

    def __init__(self, loader) -> None:
        self._loader = loader
        self._ready: dict[tuple, object] = {}

    def __getattr__(self, name: str):
        if name in ("_loader", "_ready") or name.startswith("__"):  # its own (unset while unpickled), protocols
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __reduce__(self):
        # sent to a Ray worker with the job (src.cluster): Hydra's loader only, not the jobs composed ahead
        return Precomposed, (self._loader,)

    def compose_ahead(self, master_config, overrides: list[str]) -> None:
        self._ready[(id(master_config), tuple(overrides))] = self._loader.load_sweep_config(master_config, overrides)

    def load_sweep_config(self, master_config, sweep_overrides: list[str]):
        ready = self._ready.pop((id(master_config), tuple(sweep_overrides)), None)  # taken once: the launcher edits it
        return ready if ready is not None else self._loader.load_sweep_config(master_config, sweep_overrides)


def legal(sweeper, batch: list[list[str]]) -> None:
    """Every job of the batch composed before any runs (and kept for the launcher: Precomposed); one that cannot
    be ends the sweep in one line (src.run checked each value already: this is the sweeper's own guard)."""
    try:
        for job in batch:
            sweeper.hydra_context.config_loader.compose_ahead(sweeper.config, list(job))  # Rounds.setup's
    except ConfigCompositionException as err:
        # a stop that landed inside the composition comes back wrapped as a composition error with no message
        # (fresh-clone CI: SIGTERM there read as an IndexError's traceback): the stop is what happened
        signals.check()
        raise SweepAbort(f"a job of the sweep cannot be composed: {message_line(err)}") from None


class Rounds:
    """The work of the `rounds` sweeper (hydra_plugins.quantspec_rounds): Hydra's basic sweeper (the
    cartesian product of the sweep's overrides, each batch composed, launched and its returns read as it
    does), run `rounds` times."""

    def setup(self, *, hydra_context, task_function, config) -> None:
        # the launcher (local or Ray) is made from this context, so it takes the jobs legal() composed ahead
        context = HydraContext(
            config_loader=Precomposed(hydra_context.config_loader), callbacks=hydra_context.callbacks
        )
        super().setup(hydra_context=context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]):
        overrides = parse_overrides(self, arguments)
        try:
            sweep = sweep_of(self.config)
        except ConfigError as err:
            raise SweepAbort(str(err)) from None
        rounds, reruns = sweep.rounds, sweep.busy_reruns
        for o in overrides:
            if o.get_key_element() == ROUND and rounds > 1:
                raise SweepAbort(f"round is set by the sweep's rounds={rounds}; leave {o.input_line} out")
        # every sweep, one round or several, is run here: a one-round sweep's busy round is measured again too
        jobs = [job for batch in self.split_arguments(overrides, None) for job in batch]
        jobs = [told(job, varying(jobs)) for job in jobs]  # each job named by what the sweep varies
        open_sweep_dir(self.config)
        # each job composed once, before any runs: a later round differs from round 1 only by its `round` (an
        # integer any job takes)
        legal(self, jobs)
        returns, index, done, busy = [], 0, 0, 0
        while True:
            r = done + 1
            (batch,) = schedule(jobs, 1, first=r)
            log.info(
                "round %d %s: %d jobs",
                r,
                f"of {rounds}" if r <= rounds else "(measured again: busy rounds)",
                len(batch),
            )
            finished = False
            for part in _parts(batch, self.max_batch_size):
                returns.append(self._launch(part, index))
                index += len(part)
                finished |= any(result.return_value == "finished" for result in returns[-1])
            done += 1
            # only a finished job was timed: a round of refused or failed jobs has no store to ask (a config
            # refused before any run, as a bad experiment name, must leave no store behind) and nothing busy
            busy += finished and self._busy(sweep, r)
            if done - busy >= rounds:
                break
            if done >= rounds + reruns:
                if busy:
                    say(
                        f"{busy} of {done} rounds ran on a busy host (host_busy) and busy_reruns={reruns} "
                        f"are spent; the report leaves busy rounds out where it can and marks the rest",
                    )
                break
            if done >= rounds:
                say(
                    f"{busy} of {done} rounds ran on a busy host (host_busy); measuring round {r + 1} "
                    f"({r + 1 - rounds} of at most {reruns} more)",
                )
        return returns

    def _launch(self, batch: list[list[str]], index: int):
        """One batch of a round, as Hydra's basic sweeper launches one (its jobs composed already, in
        sweep()): launched, and each job's return read (an error a job raised is raised here, not passed
        over)."""
        try:  # Hydra makes each job's folder and writes its config before the job runs
            results = self.launcher.launch(batch, initial_job_idx=index)
        except OSError as err:
            raise SweepUnwritable(err) from None
        for result in results:
            _ = result.return_value
        return results

    def _busy(self, sweep, r: int) -> bool:
        """Whether a job of round r was timed on a busy host, as the store holds it (any launcher).
        `sweep`: the sweep's settings (src.assembly.config.SweepSettings)."""
        try:
            return record.ledger.store_for(sweep).busy_round(str(sweep.sweep_dir), r)
        except Exception as err:  # noqa: BLE001 - no store to ask (journaling): measure no extra round
            log.warning("cannot tell whether round %d was busy (%s); no extra round", r, type(err).__name__)
            return False
