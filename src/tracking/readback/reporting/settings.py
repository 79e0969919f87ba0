"""The report's settings (python -m src.report --help lists them): which sweep, which store, the baseline each
job's speedup is over, and the quality floor. A sweep's own report (report_at_end) takes their defaults."""

from __future__ import annotations

from src.common.axes import AXES
from src.common.settings import Command, Setting, SettingError
from src.tracking.readback import speed_quality as q

READ, COMPARE, WRITE = "which sweep", "what each job is compared with", "what it writes"
SETTINGS = [
    Setting("sweep", None, "a sweep directory (its id); null: the latest sweep", purpose=READ),
    Setting(
        "tracking.uri",
        None,
        "the store (null: MLFLOW_TRACKING_URI, else sqlite:///<project>/mlflow.db)",
        purpose=READ,
    ),
    Setting("experiment", "quantspec", "the MLflow experiment the sweep was recorded under", purpose=READ),
    Setting(
        "out",
        "reports",
        "written to <out>/<sweep name>-<key of its id>/ (and attached to the sweep's parent run)",
        purpose=WRITE,
    ),
    Setting(
        "format",
        "markdown",
        "what it prints: markdown (report.md) or json (report.json, docs: reference/report-json.md); both are written",
        choices=("markdown", "json"),
        purpose=WRITE,
    ),
    Setting(
        "attach",
        True,
        "attach the files to the sweep's parent run and publish its view in the MLflow UI",
        purpose=WRITE,
    ),
    Setting(
        "baseline",
        {"precision": "fp32", "draft": "none"},
        "each job's speedup is over the job that differs only in these choices (same model, hardware, task, "
        "engine): baseline.<group>=<choice>",
        parts=AXES,
        purpose=COMPARE,
    ),
    Setting(
        "quality.metric",
        "kl_mean",
        "the front's quality figure (kl_mean, delta_perplexity, perplexity, divergent_share: lower is better; "
        "accuracy: higher)",
        choices=tuple(q.METRICS),
        purpose=COMPARE,
    ),
    Setting(
        "quality.min_ratio",
        0.99,
        "MLPerf's rule: a job below this fraction of its reference's quality (perplexity: reference ppl / ppl; "
        "accuracy: accuracy / the reference precision's) is flagged wherever its speed is shown",
        purpose=COMPARE,
    ),
]


def command(doc: str) -> Command:
    return Command("python -m src.report", doc, SETTINGS)


def settings(argv: list[str] = ()) -> dict:
    """The command line's settings, checked; SettingError (one line) for one that is not one."""
    cfg, _ = command("").parse(list(argv))
    if not 0 < cfg["quality.min_ratio"] <= 1:
        raise SettingError(f"quality.min_ratio={cfg['quality.min_ratio']} must be above 0 and at most 1")
    baseline = {k: v for k, v in cfg["baseline"].items() if v is not None}
    cfg["baseline"] = baseline
    cfg["quality"] = {"metric": cfg.pop("quality.metric"), "min_ratio": cfg.pop("quality.min_ratio")}
    return cfg


DEFAULT_QUALITY = settings()["quality"]
DEFAULT_BASELINE = settings()["baseline"]
