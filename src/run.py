"""Entry point: compose -> validate -> load -> run the task -> log. The only module that reads Hydra config.

    python -m src.run                                   # one job on the defaults
    python -m src.run -m hardware=phx,stx precision=fp32,bf16   # a sweep: one MLflow parent, a child per job

Each job is wrapped: a failure marks its MLflow run FAILED with the reason and the sweep goes on; an
unsupported hardware x precision pair is recorded as skipped. The process exits 1 if any job failed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from src import signals
from src.environment import PROJECT_ROOT
from src.signals import Stopped

CONF_DIR = PROJECT_ROOT / "conf"
GROUPS = ("model", "hardware", "precision", "draft", "task", "engine", "dataset", "tracking")
TAG_GROUPS = ("model", "hardware", "precision", "draft", "task")
LAUNCHERS = ("basic", "ray")   # Hydra's own, and quantspec's (hydra_plugins/quantspec_ray)

log = logging.getLogger("quantspec")
_outcomes: list[str] = []  # one per job of this process, for the exit code and the sweep summary


def fail_line(message: str) -> None:
    print(f"quantspec: {message}", file=sys.stderr, flush=True)


# --- checks before Hydra composes anything --------------------------------------------------------

def unknown_choice(args: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """One line naming an unknown group choice on the command line, or None.

    Hydra's own message for this is a dozen lines with a search path; users need the name and the options.
    """
    for arg in args:
        launcher = re.fullmatch(r"hydra/launcher=(.*)", arg)
        if launcher and launcher.group(1) not in LAUNCHERS:
            return f"unknown hydra/launcher {launcher.group(1)!r}; choose from: {', '.join(LAUNCHERS)}"
        match = re.fullmatch(r"\+?(\w+)=([^()\[\]{}]*)", arg)
        if not match or match.group(1) not in GROUPS:
            continue
        group, values = match.groups()
        known = sorted(p.stem for p in (conf_dir / group).glob("*.yaml") if not p.stem.startswith("_"))
        for value in (v.strip() for v in values.split(",")):
            if value not in known:
                return (f"unknown {group} {value!r}; choose from: {', '.join(known)} "
                        f"(or add conf/{group}/{value}.yaml)")
    return None


def unknown_key(args: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """One line naming an override of a group's field that the chosen entry does not have, or None.

    Hydra's own message is five lines ending in a hint about HYDRA_FULL_ERROR."""
    from src.config import ConfigError
    chosen = {g: [v.strip() for v in m.group(2).split(",")] for a in args
              if (m := re.fullmatch(r"(\w+)=([^()\[\]{}]*)", a)) and (g := m.group(1)) in GROUPS}
    defaults = OmegaConf.load(conf_dir / "config.yaml").defaults
    for entry in defaults:
        if isinstance(entry, DictConfig):
            for group, value in entry.items():
                chosen.setdefault(str(group), [str(value)])
    for arg in args:
        match = re.fullmatch(r"(\w+)\.([\w.]+)=.*", arg)
        if not match or match.group(1) not in GROUPS:
            continue
        group, path = match.groups()
        for value in chosen.get(group, []):
            try:
                node = group_entry(group, value, group)
            except ConfigError:
                continue  # an unknown choice is unknown_choice's to report
            for part in path.split("."):
                if not isinstance(node, dict) or part not in node:
                    return (f"{group}.{path} is not a setting of {group} {value}; its settings: "
                            f"{', '.join(sorted(node)) if isinstance(node, dict) else '(none below ' + part + ')'}")
                node = node[part]
    return None


def group_entry(group: str, name: str, where: str, conf_dir: Path = CONF_DIR) -> dict:
    """conf/<group>/<name>.yaml over the files its defaults list names (e.g. _fields), as a plain dict:
    a draft names its model and precision by their group entries."""
    from src.config import ConfigError

    path = conf_dir / group / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (conf_dir / group).glob("*.yaml") if not p.stem.startswith("_"))
        raise ConfigError(f"{where}={name!r} is not in conf/{group}/; choose from: {', '.join(known)}")
    node = OmegaConf.load(path)
    defaults = node.pop("defaults", None) or []
    bases = [OmegaConf.load(conf_dir / group / f"{d}.yaml") for d in defaults if isinstance(d, str) and d != "_self_"]
    return OmegaConf.to_container(OmegaConf.merge(*bases, node), resolve=True)


def draft_parts(raw: dict) -> dict:
    """The draft model's and precision's configs: named entries, or the target's own where null."""
    draft = raw.get("draft") or {}
    if draft.get("kind") != "model":
        return {}
    return {"model": group_entry("model", draft["model"], "draft.model") if draft.get("model") else raw["model"],
            "precision": (group_entry("precision", draft["precision"], "draft.precision")
                          if draft.get("precision") else raw["precision"])}


# --- one job ---------------------------------------------------------------------------------------

class SweepAbort(BaseException):
    """The sweep cannot go on (no tracking store): a BaseException, so Hydra does not run every other job
    into the same wall first. The message is the one line the user sees."""


_said: set[str] = set()
_active: dict = {}   # the store and sweep of the job under way, for closing them when a signal stops us
_sweep_counts: dict[str, int] = {}   # the sweep's job counts as the store holds them, for the exit code
# Where a job runs: the Ray node and its host (src.cluster sets the node on a worker).
NODE = {"node": "local", "node_host": socket.gethostname()}


def fail_once(message: str) -> None:
    """A config error repeats in every job of a sweep: say it once."""
    if message not in _said:
        _said.add(message)
        fail_line(message)


def _sweep_info(hc):
    from src.tracking import SweepInfo
    if hc.mode != RunMode.MULTIRUN:
        return None
    sweep_dir = Path(hc.sweep.dir).resolve()
    # The default layout is multirun/<date>/<time>-<pid>; a named sweep directory names itself.
    name = f"{sweep_dir.parent.name} {sweep_dir.name}" if sweep_dir.parent.parent.name == "multirun" else sweep_dir.name
    # The sweep's own command line (hc.overrides.task is one job's share of it).
    return SweepInfo(str(sweep_dir), f"sweep {name}", " ".join(a for a in sys.argv[1:] if a not in ("-m", "--multirun")))


def run_job(raw: dict, choices: dict[str, str], sweep, job_key: str = "", output_dir: Path | None = None,
            preset: tuple[str, str] | None = None) -> str:
    """Run one composed job and record it. Returns its outcome: finished, skipped, failed or killed.

    A config error is one line and no run. A job a previous attempt of the same sweep finished is kept,
    not rerun (resume=false reruns it). Everything measured is journaled in `output_dir` as it is
    logged, so a store that fails mid-job loses nothing."""
    from src.config import ConfigError, job_config_from_dict
    from src.journal import Journal
    from src.tracking import JobRun, StoreUnreachable, default_uri, flatten, key_of, open_store

    name = "·".join(choices.get(g, "?") for g in TAG_GROUPS)
    try:
        cfg = job_config_from_dict(raw, draft_parts(raw))
    except ConfigError as err:
        fail_once(str(err))
        _outcomes.append("failed")
        return "failed"
    uri = cfg.tracking.uri or default_uri()
    registry = cfg.cache_dir / "journals"
    try:
        store = open_store(uri, cfg.experiment, registry, cfg.tracking.unreachable == "journal")
    except StoreUnreachable as err:
        raise SweepAbort(str(err)) from None
    _active.update(store=store, sweep=sweep, job=None)
    job_key = key_of(job_key or name)
    if sweep and store and cfg.resume:
        done = store.finished_job(sweep.sweep_id, job_key)
        if done is not None:
            print(f"quantspec: job {name} already finished in this sweep (run {done.info.run_id}); kept "
                  f"(resume=false reruns it)", flush=True)
            _outcomes.append("finished")
            return "finished"
    try:
        journal = Journal(output_dir or Path("outputs") / "journals" / job_key, registry, uri)
    except OSError as err:
        log.warning("cannot write a journal (%s); results go to the store only", err)
        journal = None
    params = {**flatten({k: v for k, v in raw.items() if k != "hydra"}),
              **{f"choice.{k}": v for k, v in choices.items()}}
    job = JobRun(store, journal, uri, cfg.experiment)
    _active["job"] = job
    try:
        job.start(name, sweep, params, {**{g: choices.get(g, "?") for g in (*TAG_GROUPS, "engine")}, **NODE}, job_key)
        if preset is not None:
            _record_preset(job, name, *preset)
        else:
            _execute(cfg, raw, job, name)
    except (KeyboardInterrupt, Stopped) as err:
        signals.stopping()
        try:
            job.kill(signals.describe(err)[0])
        except StoreUnreachable:
            pass  # nothing can record it; the owner record lets the next run end it
        raise
    except Exception as err:  # noqa: BLE001 - recorded in full (error.txt) and reported in one line
        fail_line(f"job {name} failed: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}")
        try:
            job.fail(err)
        except StoreUnreachable as lost:
            fail_line(f"job {name}: {lost}")
    finally:
        _outcomes.append(job.outcome or "failed")
        if job.where():
            fail_line(f"job {name}: the tracking store failed ({job.offline}); its results are journaled in "
                      f"{job.where()} and go to the store with the next run or `python -m src.sync`")
    return job.outcome or "failed"


def _record_preset(job, name: str, outcome: str, reason: str) -> None:
    if outcome == "skipped":
        job.skip(reason)
        print(f"quantspec: job {name} skipped: {reason}", flush=True)
    else:
        job.fail(RuntimeError(reason))
        fail_line(f"job {name} failed: {reason}")


def _execute(cfg, raw: dict, job, name: str) -> None:
    import torch

    from src import environment, hardware
    from src.corpus import load_text
    from src.engine import engine_for, roofline
    from src.metrics import rows_csv, seed_table, summary_table
    from src.models import load_model
    from src.tasks import TASKS, TaskInputs

    job.log_text(OmegaConf.to_yaml(OmegaConf.create(raw)), "config.yaml")
    reason = cfg.unsupported_reason()
    if reason:
        job.skip(reason)
        print(f"quantspec: job {name} skipped: {reason}", flush=True)
        return

    placement = hardware.resolve(cfg.hardware)
    if placement.note:
        log.warning(placement.note)
    torch.set_num_threads(placement.threads)
    env = environment.describe(placement.threads, placement.device)
    job.set_tags({"executed_on": placement.executed_on, "placement_note": placement.note or "",
                  "git_commit": env["git_commit"], "cpu_model": env["cpu_model"],
                  "threads": str(placement.threads)})
    job.log_text(json.dumps(env, indent=2), "environment.json")

    loaded = load_model(cfg.model, cfg.cache_dir)
    job.log_metrics({"model_load_s": loaded.load_s})
    check_context(cfg, loaded)
    corpus = lambda: load_text(cfg.dataset)  # noqa: E731 - read only by the tasks and calibration that need it
    model, quant_metrics = _prepare_precision(cfg.model, cfg.precision, cfg, loaded, corpus, job)
    model = model.to(placement.device)
    model.set_attn_implementation(cfg.engine.attention)
    _install_kernels(cfg, model, placement, job)
    plain = engine_for(cfg.engine.kind, cfg.engine.step_path)
    drafter = _prepare_draft(cfg, loaded, corpus, placement, job) if cfg.draft.active else None
    engine = plain if drafter is None else engine_for(cfg.engine.kind, cfg.engine.step_path, drafter,
                                                      k=cfg.draft.k, schedule=cfg.draft.schedule,
                                                      k_max=cfg.draft.k_max)
    inputs = TaskInputs(model, loaded.tokenizer, cfg.task, cfg.model.code, cfg.sampling, loaded.max_context,
                        corpus, engine, baseline=plain if drafter is not None and cfg.draft.baseline else None)
    result = TASKS[cfg.task.kind](inputs)
    if result.rows:  # a timed task: set its decode steps against the memory-bandwidth roofline
        bandwidth = roofline.host_bandwidth(cfg.cache_dir, placement.threads, env["cpu_model"])
        result.series["decode_efficiency"], extra = roofline.efficiency(model, result.rows, bandwidth)
        result.summary.update(extra)

    # The table first: whatever happens to the store below, the user has seen the measurements.
    table = seed_table(result.rows) if result.rows else summary_table({**quant_metrics, **result.summary})
    print(f"\n{name} (executed on {placement.executed_on})\n{table}\n", flush=True)
    for row in result.rows:
        job.log_metrics(row.metrics(), step=row.example)
    for metric, values in result.series.items():
        for step, value in enumerate(values, start=1):
            job.log_metrics({metric: value}, step=step)
    job.log_metrics(result.summary)
    if result.rows:
        job.log_text(table + "\n", "examples.md")
        job.log_text(rows_csv(result.rows), "examples.csv")
    for file_name, text in result.artifacts.items():
        job.log_text(text, file_name)
    for note in result.notes:
        log.warning(note)
    job.finish()


def check_context(cfg, loaded) -> None:
    """Refuse, before anything is quantized or timed, work that would run past the model's context."""
    from src.config import ConfigError
    from src.tasks.decode import prompts

    task, new, max_context = cfg.task, cfg.task.new_tokens(cfg.model.code), loaded.max_context
    if task.kind == "perplexity" and task.window > max_context:
        raise ConfigError(f"task.window={task.window} exceeds {cfg.model.name}'s context of {max_context} tokens; "
                          f"use task.window={max_context} or less")
    if task.kind == "decode":
        longest = max(len(loaded.tokenizer(p).input_ids) for p in prompts(cfg.model.code)[:task.limit])
        if longest + new > max_context:
            field = f"task.{'code_' if cfg.model.code else ''}max_new_tokens"
            raise ConfigError(f"{field}={new} with a {longest}-token prompt exceeds {cfg.model.name}'s context of "
                              f"{max_context} tokens; use {field}={max_context - longest} or less")
    if task.kind == "benchmark":
        dropped = [n for n in task.prompt_lengths if n + new > max_context]
        if len(dropped) == len(task.prompt_lengths):
            raise ConfigError(f"no prompt length of task {task.name} fits {cfg.model.name}'s context of {max_context} "
                              f"tokens with {new} new tokens")
        if dropped:  # said now, before the timing; the task drops them
            log.warning("prompt lengths %s dropped: with %d new tokens they exceed the model's context of %d",
                        dropped, new, max_context)


def _prepare_draft(cfg, loaded, corpus, placement, job):
    """The drafter for draft.kind: prompt lookup, or a draft model at its precision (quantized once,
    through the same cache as targets) whose tokenizer must be the target's."""
    from src.config import ConfigError
    from src.engine.speculative import ModelDrafter, PromptLookup
    from src.models import load_model, tokenizer_mismatch

    if cfg.draft.kind == "prompt_lookup":
        return PromptLookup(cfg.draft.max_ngram, cfg.draft.min_ngram)
    draft_loaded = load_model(cfg.draft_model, cfg.cache_dir)
    mismatch = tokenizer_mismatch(loaded.tokenizer, draft_loaded.tokenizer)
    if mismatch:
        raise ConfigError(f"draft model {cfg.draft_model.name} does not share {cfg.model.name}'s tokenizer "
                          f"({mismatch}); pick a draft of the target's family")
    job.log_metrics({"draft_model_load_s": draft_loaded.load_s})
    model, _ = _prepare_precision(cfg.draft_model, cfg.draft_precision, cfg, draft_loaded, corpus, job, "draft_")
    if cfg.draft.vocab:
        from src.engine.subset_head import cut_head, frequent_tokens
        kept = cut_head(model, frequent_tokens(draft_loaded.tokenizer, corpus(), cfg.draft.vocab))
        job.log_metrics({"draft_vocab": kept})
    model = model.to(placement.device)
    model.set_attn_implementation(cfg.engine.attention)
    _install_kernels(cfg, model, placement, job, tag=False)
    return ModelDrafter(model, fast=cfg.engine.step_path == "quantspec")


def _install_kernels(cfg, model, placement, job, tag: bool = True) -> None:
    """engine.kernels=quantspec: decode-step matmuls through src/kernels, or ATen's where they cannot run."""
    used, note = "aten", ""
    if cfg.engine.kernels == "quantspec":
        from src import kernels
        from src.kernels import modules

        if placement.device != "cpu":
            note = f"quantspec kernels are CPU kernels; {placement.device} keeps ATen's"
        elif kernels.load(cfg.cache_dir / "kernels"):
            used = "quantspec"
            counts = modules.install(model)
            if tag:
                job.log_params({f"kernels.{kind}": count for kind, count in sorted(counts.items())})
        else:
            note = f"quantspec kernels unavailable, ATen's used: {kernels.reason()}"
    if note and tag:
        log.warning(note)
    if tag:
        job.set_tags({"kernels": used, "kernels_note": note})


def _prepare_precision(model_cfg, precision, cfg, loaded, corpus, job, prefix: str = ""):
    """Cast to the precision's dtype, quantizing first (from the cache when it holds this key).
    Returns the model and the quantization step's metrics (empty for a float precision). `prefix`
    names a draft's metrics and tags apart from the target's."""
    from src.quant.apply import prepare

    model, report = prepare(loaded, model_cfg, precision, corpus, cfg.cache_dir)
    if report is None:
        return model, {}
    log.info("%s%s %s in %.1f s (%s)", prefix.replace("_", " "),
             "quantized" if report.built else "loaded quantized weights", precision.name, report.seconds,
             report.cache_dir)
    metrics = {prefix + k: v for k, v in report.metrics().items()}
    job.log_metrics(metrics)
    job.set_tags({prefix + "quant_cache": str(report.cache_dir),
                  **({prefix + "smoothquant_alpha": str(report.alpha)} if report.alpha is not None else {})})
    return model, metrics


# --- Hydra glue ------------------------------------------------------------------------------------

# Two sweeps started in the same second must not share a directory (and so a parent run): the default
# sweep directory ends in the sweeping process's id. Cached: every job of the sweep sees one value.
OmegaConf.register_new_resolver("quantspec_pid", lambda: str(os.getpid()), use_cache=True, replace=True)


def _store_for(config: DictConfig):
    from src.tracking import Store
    return _active.get("store") or Store(_tracking_uri(config), str(config.experiment))


def _tracking_uri(config: DictConfig) -> str:
    from src.tracking import default_uri
    return OmegaConf.select(config, "tracking.uri") or default_uri()


class SweepCallback(Callback):
    """Closes the sweep's parent run once every job has run, with the job counts the store holds."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        counts = {o: _outcomes.count(o) for o in ("finished", "skipped", "failed", "killed")}
        try:
            store = _store_for(config)
            parent = store.find_sweep(str(Path(config.hydra.sweep.dir).resolve()))
            if parent is not None:
                counts = store.close_sweep(parent.info.run_id)
                _sweep_counts.update(counts)
        except Exception as err:  # noqa: BLE001 - the jobs are recorded; the next run closes the parent
            fail_line(f"could not close the sweep's parent run ({str(err).splitlines()[0]}); the next run will")
        print(f"quantspec: sweep done: {counts['finished']} finished, {counts['skipped']} skipped, "
              f"{counts['failed']} failed" + (f", {counts['killed']} killed" if counts.get("killed") else ""),
              flush=True)


def task(cfg: DictConfig, preset: tuple[str, str] | None = None) -> str:
    """One job, as Hydra's launchers call it (here, or on a Ray worker: src.cluster). `preset` records the
    job with that (outcome, reason) without running it: a launcher that could not place it says why."""
    hc = HydraConfig.get()
    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        fail_once(f"{err.full_key} must be set (e.g. {err.full_key}=...)")
        _outcomes.append("failed")
        return "failed"
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra") and v is not None}
    return run_job(raw, choices, _sweep_info(hc), hc.job.override_dirname, Path(hc.runtime.output_dir), preset)


# An absolute path: Hydra resolves a relative one against the calling module, which differs between
# `python -m src.run` and an import.
main = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(task)


def _stopped(err: BaseException) -> int:
    """A signal ended the process: close what is open, say so in one line, and return the exit code."""
    signals.stopping()
    reason, code = signals.describe(err)
    store, sweep, job = _active.get("store"), _active.get("sweep"), _active.get("job")
    said = f"quantspec: {reason}"
    if job is not None and job.outcome == "killed":
        said += f"; the job under way is recorded as killed"
    if store is not None and sweep is not None:
        try:
            parent = store.find_sweep(sweep.sweep_id)
            counts = store.close_sweep(parent.info.run_id, "KILLED", reason) if parent else {}
            said += (f"; sweep closed ({', '.join(f'{n} {o}' for o, n in counts.items() if n) or 'no jobs'}); "
                     f"resume with hydra.sweep.dir={sweep.sweep_id}")
        except Exception as close_err:  # noqa: BLE001 - the next run closes it from its owner record
            said += f"; the sweep's parent stays open until the next run ({type(close_err).__name__})"
    print(said, file=sys.stderr, flush=True)
    return code


def cli() -> None:
    problem = unknown_choice(sys.argv[1:]) or unknown_key(sys.argv[1:])
    if problem:
        fail_line(problem)
        sys.exit(2)
    # Library chatter would bury the tables; our own log lines stay at INFO.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from src.progress import watched
    from src.tracking import bound_http_retries
    if not watched():  # transformers' own bars (GGUF conversion, weight loading) too
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    bound_http_retries()
    for chatty in ("mlflow.store.db.utils", "alembic"):  # schema set-up notes on a store's first use
        logging.getLogger(chatty).setLevel(logging.WARNING)
    signals.install()
    try:
        main()
    except (KeyboardInterrupt, Stopped) as err:
        sys.exit(_stopped(err))
    except SweepAbort as err:
        fail_line(str(err))
        sys.exit(2)
    # A sweep's outcome is the store's (its jobs may have run in other processes, on other machines).
    failed = (_sweep_counts.get("failed", 0) + _sweep_counts.get("killed", 0) if _sweep_counts
              else len({"failed", "killed"} & set(_outcomes)))
    sys.exit(1 if failed or "failed" in _outcomes else 0)


if __name__ == "__main__":
    # Hydra imports SweepCallback from `src.run`; running that same module (not this `__main__` copy)
    # keeps one list of job outcomes for the callback and the exit code.
    from src import run as entry
    entry.cli()
