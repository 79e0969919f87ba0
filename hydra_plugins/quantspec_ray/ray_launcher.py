"""`hydra/launcher=ray`: each job of a sweep runs as a Ray task on a node that has its hardware.

Hydra finds launchers in the `hydra_plugins` namespace; this file only registers the choice and hands
the work to src.cluster, so that Ray is imported only by sweeps that use it.
"""

# No `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules, where
# dataclasses cannot resolve string annotations.
from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class RayLauncherConf:
    _target_: str = "hydra_plugins.quantspec_ray.ray_launcher.RayLauncher"
    address: str = "auto"  # the cluster to join: auto (RAY_ADDRESS or a local head) or HOST:PORT
    slot: str = "bench-slot"  # one unit per job, one per node: two timed jobs never share a machine


ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayLauncherConf, provider="quantspec")


class RayLauncher(Launcher):
    def __init__(self, address: str = "auto", slot: str = "bench-slot") -> None:
        self.address, self.slot = address, slot
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from src import cluster

        return cluster.launch(self, job_overrides, initial_job_idx)
