"""A job's config from a command line of overrides, composed as src.run composes each job of a sweep, for the
commands that run one job's parts in process (python -m src.serve, the scripts that time a job's parts)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf

from src.assembly import ownmodel
from src.assembly.config import JobConfig, job_config_from_dict
from src.assembly.overrides import CONF_DIR, composition_problem, unparsable
from src.common import signals
from src.common.say import message_line
from src.common.schema import ConfigError


def job_config(args: list[str]) -> JobConfig:
    """The JobConfig of these overrides; ConfigError with src.run's one line where they cannot be composed."""
    problem = unparsable(args) or composition_problem(args)  # src.run's one-line checks
    if problem is None:
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose("config", overrides=args)
        except HydraException as e:  # what those leave to Hydra, e.g. a word without '=': one line, no traceback
            signals.check()  # a stop that landed inside the composition, wrapped as its error
            first = message_line(e, empty=type(e).__name__)
            hint = " (overrides are key=value, e.g. model=llama-160m)" if isinstance(e, OverrideParseException) else ""
            problem = first + hint
    if problem is not None:
        raise ConfigError(problem)
    raw = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k] for k in cfg}
    # a model of one's own (model=hub, model=gguf): its family read from its own config, as src.run reads it
    raw, _ = ownmodel.resolve(raw, {})
    return job_config_from_dict(raw)
