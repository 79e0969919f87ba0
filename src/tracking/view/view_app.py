"""MLflow's server with one page more: `/quantspec/view/<experiment id>/<key>` opens a sweep's view so that
it survives a reload. Served by `mlflow ui --app-name quantspec` (or `mlflow server --app-name quantspec`):
pyproject.toml registers this module's `app` as the MLflow app `quantspec`.

Why it is needed (MLflow 3.17's runs page, useSharedExperimentViewState): a view stored as an experiment
tag and opened with `?viewStateShareKey=<key>` is applied only while the address holds no search facets,
and applying it writes its facets (searchFilter, orderByKey, ...) into the address. The rewritten address
still names the key, so the page keeps the browser from saving its state, but on a reload the key is passed
over (facets are present) and the columns and charts fall back to the browser's saved state or MLflow's
defaults: no metric columns. What MLflow reads on every load of a plain experiment address is the browser's
own saved view state (localStorage `MLflowLocalStorage-1.1-ExperimentPage-["<id>"]-ReactComponentState`,
facets and UI state together). This page copies the stored view there and opens the plain address with the
view's facets: a reload reads the same state again, and the user's own changes to it are saved as usual.
"""

from __future__ import annotations

import json
import logging
import re

import mlflow
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute
from mlflow.server.fastapi_app import app

from src.tracking.view.ui import VIEW_TAG

# What this page knows of MLflow's UI (the saved state's key and form) was read from these versions' source; pyproject
# holds mlflow to them. Another (installed by hand) may key or read the state otherwise: said once, when served.
KNOWN_MLFLOW = ("3.17.",)
if not mlflow.__version__.startswith(KNOWN_MLFLOW):
    logging.getLogger(__name__).warning(
        "quantspec's view page was written against MLflow %s's saved view state; MLflow %s may not open a sweep's "
        "columns and charts (the runs are all there): install mlflow>=3.17,<3.18 for the view",
        "/".join(v.rstrip(".") for v in KNOWN_MLFLOW),
        mlflow.__version__,
    )

# MLflow's saved view state of an experiment page (its LocalStorageUtils, version 1.1), keyed by the page's
# experiment ids as JSON
STORAGE_KEY = 'MLflowLocalStorage-1.1-ExperimentPage-["{experiment_id}"]-ReactComponentState'

PAGE = """<!doctype html>
<meta charset="utf-8"><title>quantspec: opening the sweep's view</title>
<p id="said">Opening the sweep's view...</p>
<script>
(async () => {{
  const said = (text) => document.getElementById("said").textContent = text;
  try {{
    const answer = await fetch("../../../ajax-api/2.0/mlflow/experiments/get?experiment_id={experiment_id}");
    if (!answer.ok) throw new Error("the server answered " + answer.status);
    const tags = (await answer.json()).experiment.tags || [];
    const tag = tags.find((t) => t.key === {tag});
    if (!tag) {{ said("No view {key} in experiment {experiment_id}: run the sweep's report (python -m src.report)."); return; }}
    const view = JSON.parse(tag.value);
    localStorage.setItem({storage_key}, JSON.stringify(view));
    const facets = new URLSearchParams({{searchFilter: view.searchFilter || "", orderByKey: view.orderByKey || "",
                                        orderByAsc: String(view.orderByAsc), workflowType: "machine_learning"}});
    location.replace("../../../#/experiments/{experiment_id}/runs?" + facets.toString());
  }} catch (err) {{ said("Could not open the view: " + err.message); }}
}})();
</script>
"""


def view_page(experiment_id: str, key: str) -> HTMLResponse:
    """The page that saves the view `key` of the experiment as the browser's own state, then opens it."""
    if not re.fullmatch(r"\d+", experiment_id) or not re.fullmatch(r"[\w.-]+", key):
        return HTMLResponse(
            "Not the address of a quantspec view (/quantspec/view/<experiment id>/<key>)", status_code=404
        )
    return HTMLResponse(
        PAGE.format(
            experiment_id=experiment_id,
            key=key,
            tag=json.dumps(VIEW_TAG + key),
            storage_key=json.dumps(STORAGE_KEY.format(experiment_id=experiment_id)),
        )
    )


# before MLflow's own routes: its last one is the catch-all mount of its Flask app
app.router.routes.insert(0, APIRoute("/quantspec/view/{experiment_id}/{key}", view_page, methods=["GET"]))
