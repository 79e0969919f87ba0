"""A job's name: what makes it differ from the sweep's other jobs, short and stable.

A run is named by its choices (model·hardware·precision·draft·task, then the engine where it is not
quantspec's own), plus each *field* its sweep varies (`precision.head_format=w8a16,w4a16`, a search's
`precision.alpha`), as `head_format=w8a16`: without them, two jobs of one sweep would carry one name in the
view, the report, regress and the search. A field every job of the sweep shares stays out of the name.

Only the sweeper sees the whole sweep, so it tells each job which fields vary, through a Hydra setting
(`hydra.job.env_set.QUANTSPEC_VARIES`) that is no part of the job's config, its directory or its key.
"""

from __future__ import annotations

from src.common.axes import AXES
from src.common.mdtext import plain

VARIES = "QUANTSPEC_VARIES"
NAMED_GROUPS = AXES[:-1]  # the engine is added only where it is not native


def field_of(override: str) -> tuple[str, str] | None:
    """(key, value) of an override that sets a field (`task.limit=2`), or None for a group's choice
    (`precision=w8a8`, `precision@draft.precision=bf16`), a Hydra setting or an addition/deletion."""
    key, eq, value = override.partition("=")
    if not eq or key.startswith(("hydra.", "+", "~")) or "@" in key or "/" in key or "." not in key:
        return None
    return key, value


def varying(jobs: list[list[str]]) -> list[str]:
    """The fields whose value differs between the jobs (each a list of overrides), in the order first seen."""
    parsed = [dict(f for f in map(field_of, job) if f) for job in jobs]
    keys = list(dict.fromkeys(key for fields in parsed for key in fields))
    return [key for key in keys if len({fields.get(key) for fields in parsed}) > 1]


def told(job: list[str], keys: list[str]) -> list[str]:
    """The job's overrides with the sweep's varying fields passed along (nothing where none vary)."""
    return [*job, f"++hydra.job.env_set.{VARIES}='{' '.join(keys)}'"] if keys else list(job)


def job_name(choices: dict[str, str], overrides: list[str], varies: str = "") -> str:
    """`model·hardware·precision·draft·task[·engine][·field=value ...]`: `varies` is what the sweeper told the
    job (space-separated keys); each is shown by its last segment unless two share one."""
    name = "·".join(choices.get(g, "?") for g in NAMED_GROUPS)
    if choices.get("engine", "native") != "native":  # another runtime's job is named by it too
        name += f"·{choices['engine']}"
    keys = varies.split()
    fields = dict(f for f in map(field_of, overrides) if f)
    short = [k.rpartition(".")[2] for k in keys]
    for key, label in zip(keys, short):
        if key in fields:
            name += f"·{label if short.count(label) == 1 else key}={fields[key]}"
    return plain(name)  # a value's right-to-left override would reorder the name the UI shows
