"""The sweep's own settings (store, experiment, resume, report, rounds) from Hydra's composed config, for
src.run's sweep callback, the sweepers (src.tracking.sweep.rounds, src.tracking.sweep.search) and the Ray launcher
(src/cluster.py): converted here once, as a job's config is by src.assembly.config."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from src.assembly.config import ConfigError, SweepSettings, sweep_settings


def unset_line(err: MissingMandatoryValue) -> str:
    return f"{err.full_key} must be set (e.g. {err.full_key}=...)"


def sweep_of(config: DictConfig) -> SweepSettings:
    """The sweep's settings (src.assembly.config.SweepSettings) from Hydra's config: ConfigError, one
    line, where they are wrong."""
    try:
        top = {
            k: OmegaConf.to_container(config[k], resolve=True) if isinstance(config[k], DictConfig) else config[k]
            for k in ("tracking", "experiment", "report_at_end", "resume", "rounds", "busy_reruns")
            if k in config
        }
    except MissingMandatoryValue as err:
        raise ConfigError(unset_line(err)) from None
    return sweep_settings(top, Path(str(config.hydra.sweep.dir)))
