"""A sweep across machines: each job runs as a Ray task on a node that has its hardware.

Called by the `hydra/launcher=ray` plugin (hydra_plugins/quantspec_ray). A lab's machines join one Ray
cluster, each advertising its hardware as a resource and one `bench-slot`:

    ray start --address=HEAD:6379 --resources='{"hw-stx": 1, "bench-slot": 1}'

Each job asks for its profile's resource (`hardware.resource`) and one slot, so it lands on a machine with
that hardware and never beside another timed job. No live node with the resource: the job is recorded
skipped at once, with the reason. A node lost while its job runs (or before it starts): the job is
recorded failed with the reason, and the sweep goes on. Every node logs to one tracking server: a sweep
on the cluster refuses a local SQLite store. Ray does the placing; nothing here queues or schedules.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from src import run
from src.assembly.config import ConfigError, hardware_config
from src.assembly.sweep_settings import sweep_of
from src.common.say import message_line, say
from src.run import sweep_info
from src.tracking.store.experiment import Store, probe
from src.tracking.store.names import StoreUnreachable, key_of
from src.tracking.sweep.record import SweepAbort

log = logging.getLogger("quantspec")
WAIT_S = 2.0  # how often the driver looks for finished jobs and lost nodes


def _answers(address: str) -> bool:
    """Whether HOST:PORT accepts a connection: Ray's own connect retries a dead address for minutes."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
            return True
    except (OSError, ValueError):
        return False


def _connect(address: str) -> None:
    import ray  # optional: the lab extra

    if ray.is_initialized():
        return
    target = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    if target and target != "auto" and not target.startswith("ray://") and not _answers(target):
        raise SweepAbort(
            f"no Ray cluster answers at {target}; start one with `ray start --head --resources="
            f'\'{{"hw-cpu": 1, "bench-slot": 1}}\'`, or use hydra/launcher=basic'
        )
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise SweepAbort(
            f"no Ray cluster answers at address={address} ({message_line(err)[:120]}); "
            f'start one with `ray start --head --resources=\'{{"hw-cpu": 1, "bench-slot": 1}}\'`, or '
            f"use hydra/launcher=basic"
        ) from None


def offered() -> dict[str, str]:
    """Each resource the cluster's live nodes advertise -> the id of one node offering it."""
    import ray  # optional: the lab extra

    found = {}
    for node in ray.nodes():
        if node.get("Alive"):
            for resource in node.get("Resources", {}):
                found.setdefault(resource, node["NodeID"])
    return found


def _settings(config: DictConfig):
    """The sweep's settings, as src.assembly.sweep_settings converts them (a wrong one ends the sweep in one line)."""
    try:
        return sweep_of(config)
    except ConfigError as err:
        raise SweepAbort(str(err)) from None


def _check_store(sweep) -> None:
    uri = sweep.tracking.uri or ""
    if not uri.startswith(("http://", "https://")):
        raise SweepAbort(
            "hydra/launcher=ray needs one tracking server for every node: start it with "
            "`bash scripts/tracking-server --host 0.0.0.0` and add tracking=server "
            "tracking.uri=http://HEAD:5000"
        )
    if sweep.tracking.unreachable != "journal":
        try:
            probe(uri)
        except StoreUnreachable as err:
            raise SweepAbort(str(err)) from None


def _on_node(hydra_context, config: DictConfig, singleton_state: dict) -> JobReturn:
    """The job, on the worker Ray chose: the same job code as the basic launcher runs."""
    import ray  # optional: the lab extra

    node = {"node": ray.get_runtime_context().get_node_id(), "node_host": socket.gethostname()}
    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(config)
    return run_job(
        hydra_context=hydra_context,
        task_function=functools.partial(run.task, node=node),
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def _here(launcher, config: DictConfig, preset: tuple[str, str] | None) -> JobReturn:
    """The job code, in the driver: to record a job the cluster cannot run (preset: outcome and reason),
    or to let it say that a previous attempt of this sweep finished it."""
    HydraConfig.instance().set_config(config)
    return run_job(
        hydra_context=launcher.hydra_context,
        task_function=functools.partial(run.task, preset=preset),
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


_stores: dict = {}  # one Store per (uri, experiment) for the driver's lookups


def _in_store(config: DictConfig):
    """(the sweep's store, its sweep id, this job's key, Hydra's view of the job), as the job code names them."""
    HydraConfig.instance().set_config(config)
    hc = HydraConfig.get()
    sweep = _settings(config)
    where = (sweep.tracking.uri, sweep.experiment)
    if where not in _stores:
        _stores[where] = Store(*where)
    return _stores[where], sweep_info(hc).sweep_id, key_of(hc.job.override_dirname), hc


def _finished_before(config: DictConfig) -> bool:
    """Resume: a FINISHED attempt of this job in this sweep needs no node."""
    if not _settings(config).resume:
        return False
    store, sweep_id, key, _ = _in_store(config)
    return store.finished_job(sweep_id, key) is not None


def _lost(launcher, config: DictConfig, reason: str) -> JobReturn:
    """A job whose node died: end the run its worker opened, or record one if it never got that far."""
    store, sweep_id, key, hc = _in_store(config)
    if store.end_job(sweep_id, key, "failed", reason):
        say(f"job {' '.join(hc.overrides.task)} failed: {reason}", err=True)
        return JobReturn(
            overrides=list(hc.overrides.task),
            cfg=config,
            hydra_cfg=config,
            working_dir=str(Path.cwd()),
            task_name=hc.job.name,
            status=JobStatus.COMPLETED,
            _return_value="failed",
        )
    return _here(launcher, config, ("failed", reason))


def _resource(config: DictConfig) -> str | None:
    """The Ray resource of the job's hardware (hardware.resource, else hw-<name>), from its typed hardware
    config; None where that config is wrong."""
    try:
        hardware = hardware_config(OmegaConf.to_container(config.hardware, resolve=True, throw_on_missing=True))
    except Exception:  # noqa: BLE001 - a wrong, missing or unresolvable value: the job code says which
        return None
    return hardware.resource or f"hw-{hardware.name}"


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    import ray  # optional: the lab extra

    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    remote = ray.remote(_on_node)
    returns: list[JobReturn | None] = [None] * len(job_overrides)
    running: dict = {}  # ObjectRef -> (index, config, resource)
    for index, overrides in enumerate(job_overrides):
        config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
        with open_dict(config):
            config.hydra.job.id = f"ray_{initial_job_idx + index}"
            config.hydra.job.num = initial_job_idx + index
        if index == 0:  # before anything runs: a store every node can reach, then the cluster
            _check_store(_settings(config))
            _connect(launcher.address)
        resource = _resource(config)
        if resource is None:  # its config is wrong: the job code says so in one line, here
            returns[index] = _here(launcher, config, None)
            continue
        log.info("\t#%d : %s -> %s", initial_job_idx + index, " ".join(filter_overrides(overrides)), resource)
        if _finished_before(config):
            returns[index] = _here(launcher, config, None)
            continue
        if resource not in offered():
            returns[index] = _here(launcher, config, ("skipped", f"no node in the cluster offers {resource}"))
            continue
        ref = remote.options(
            resources={resource: 1, launcher.slot: 1},
            num_cpus=0,
            max_retries=0,
            name=f"quantspec job {initial_job_idx + index}",
        ).remote(launcher.hydra_context, config, Singleton.get_state())
        running[ref] = (index, config, resource)
    while running:
        done, _ = ray.wait(list(running), num_returns=1, timeout=WAIT_S)
        for ref in done:
            index, config, resource = running.pop(ref)
            try:
                returns[index] = ray.get(ref)
            except ray.exceptions.RayError as err:  # the node or its worker died under the job
                returns[index] = _lost(launcher, config, f"its node ({resource}) was lost: {type(err).__name__}")
        live = offered()
        for ref, (index, config, resource) in list(running.items()):
            if resource not in live:  # waiting for a node that has gone: it will never run
                ray.cancel(ref, force=True)
                running.pop(ref)
                returns[index] = _lost(launcher, config, f"the node offering {resource} left the cluster")
    return [r for r in returns if r is not None]
