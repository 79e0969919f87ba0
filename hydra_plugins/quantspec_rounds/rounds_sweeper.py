"""`hydra/sweeper=rounds` (quantspec's default): Hydra's basic sweeper, run in interleaved rounds.

Hydra finds sweepers in the `hydra_plugins` namespace; this file only registers the choice and hands
the work to src.tracking.sweep.rounds.
"""

# No `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules, where
# dataclasses cannot resolve string annotations.
from dataclasses import dataclass, field

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore

from src.tracking.sweep.rounds import Rounds


@dataclass
class RoundsSweeperConf:
    _target_: str = "hydra_plugins.quantspec_rounds.rounds_sweeper.RoundsSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/sweeper", name="rounds", node=RoundsSweeperConf, provider="quantspec")


class RoundsSweeper(Rounds, BasicSweeper):
    """Rounds' sweep over BasicSweeper's setup, argument splitting and batch validation."""
