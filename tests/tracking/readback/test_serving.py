"""The report's serving front (src.tracking.readback.serving): each task=serve level the median of its rounds,
ordered by configuration and concurrency, drawn as throughput against latency."""

import math

from src.tracking.readback import serving
from src.tracking.readback.compare import job_rounds
from src.tracking.readback.reporting.plots import _save
from src.tracking.readback.sweeps import JobRecord
from src.tracking.store.names import CONFIG_KEY


def run(server, concurrency, round_, tps, ttft, outcome="finished", task="serve"):
    tags = {
        CONFIG_KEY: f"{server}-{concurrency}-{task}", "round": str(round_), "outcome": outcome, "server": server,
        "model": "m", "hardware": "cpu", "precision": "w4a16", "draft": "none", "task": task, "engine": "native",
    }  # fmt: skip
    metrics = {"serve_output_tokens_per_s": tps, "serve_ttft_ms_p99": ttft, "serve_tpot_ms_p50": 1000 / tps}
    return JobRecord(f"{server}{concurrency}{round_}", "name", tags, metrics, {"task.concurrency": str(concurrency)})


def test_each_level_is_its_rounds_median_and_levels_sort_by_configuration_then_concurrency(tmp_path):
    jobs = [
        run("quantspec", 8, 1, 100.0, 900.0), run("quantspec", 8, 2, 120.0, 700.0),
        run("quantspec", 1, 1, 50.0, 300.0), run("quantspec", 1, 2, 60.0, 100.0, outcome="failed"),
        run("llama-server", 8, 1, 90.0, 2000.0), run("quantspec", 1, 1, 9.0, 9.0, task="decode"),
    ]  # fmt: skip
    found = serving.levels(job_rounds(jobs))
    assert [("llama-server" in lv.config, lv.concurrency, lv.rounds) for lv in found] == [
        (True, 8, 1),
        (False, 1, 1),  # the failed round is not a figure
        (False, 8, 2),
    ]
    assert found[2].figures["serve_output_tokens_per_s"] == 110.0 and found[2].figures["serve_ttft_ms_p99"] == 800.0
    assert math.isnan(found[0].figures["serve_errors"]) and found[0].rate == "closed"
    text = serving.table(found)
    assert "m·cpu·w4a16·native (quantspec)" in text and "m·cpu (llama-server, the model's GGUF)" in text
    assert serving.plot(found, tmp_path / "serving.png", _save).is_file()


def test_a_sweep_without_serve_jobs_has_no_serving_front(tmp_path):
    assert serving.levels(job_rounds([run("quantspec", 1, 1, 9.0, 9.0, task="decode")])) == []
    assert serving.plot([], tmp_path / "x.png", _save) is None


def test_a_server_measured_at_its_address_is_named_by_it():
    job = run("external", 4, 1, 50.0, 300.0)
    job.params["task.base_url"] = "http://10.0.0.5:8000"
    (level,) = serving.levels(job_rounds([job]))
    assert level.config == "m·cpu (the server at http://10.0.0.5:8000)"
