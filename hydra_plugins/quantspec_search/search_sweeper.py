"""`hydra/sweeper=search`: a multi-objective search (Optuna) over the sweep's axes for the speed–quality front.

Hydra finds sweepers in the `hydra_plugins` namespace; this file only registers the choice and its settings
and hands the work to src.tracking.sweep.search.
"""

# No `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules, where
# dataclasses cannot resolve string annotations.
from dataclasses import dataclass, field

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore

from src.tracking.sweep.search import DEFAULT_OBJECTIVES, Search


@dataclass
class SearchSweeperConf:
    _target_: str = "hydra_plugins.quantspec_search.search_sweeper.SearchSweeper"
    trials: int = 12  # configurations tried in all
    batch: int = 4  # trials asked for at a time, measured in interleaved rounds together
    sampler: str = "nsga2"  # nsga2 (multi-objective, the default), tpe, random
    seed: int = 0  # the sampler's: the same command proposes the same trials
    objectives: list[str] = field(default_factory=lambda: list(DEFAULT_OBJECTIVES))  # metric:minimize|maximize
    max_batch_size: int | None = None
    params: dict[str, str] | None = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/sweeper", name="search", node=SearchSweeperConf, provider="quantspec")


class SearchSweeper(Search, BasicSweeper):
    """Search's trials over BasicSweeper's setup and batch validation."""

    def __init__(
        self,
        trials: int,
        batch: int,
        sampler: str,
        seed: int,
        objectives: list[str],
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.trials, self.batch, self.sampler, self.seed, self.objectives = trials, batch, sampler, seed, objectives
