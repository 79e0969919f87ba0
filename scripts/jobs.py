"""A job built in process as a sweep builds it (src.assembly.job.build), for the scripts that time its parts."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf

from src.assembly.config import job_config_from_dict
from src.assembly.job import Job, build
from src.assembly.overrides import CONF_DIR, composition_problem, unparsable


def build_job(precision: str, *overrides: str) -> Job:
    """The job a sweep at this precision builds (src.assembly.job.build), here in process to time its parts."""
    args = [f"precision={precision}", *overrides]
    problem = unparsable(args) or composition_problem(args)  # src.run's one-line checks
    if problem is None:
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose("config", overrides=args)
        except HydraException as e:  # what those leave to Hydra, e.g. a word without '=': one line, no traceback
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            hint = " (overrides are key=value, e.g. model=llama-160m)" if isinstance(e, OverrideParseException) else ""
            problem = first + hint
    if problem is not None:
        raise SystemExit(f"quantspec: {problem}")
    return build(
        job_config_from_dict(
            {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k] for k in cfg}
        )
    )
