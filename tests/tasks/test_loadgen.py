"""task=serve's load generator (src.tasks.loadgen): its command line for a level, and its results read from
aiperf's own JSON export (tests/tasks/data/aiperf_export.json: the figures' keys of a real aiperf 0.13 run
against quantspec's server)."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from src.tasks import loadgen

EXPORT = Path(__file__).parent / "data" / "aiperf_export.json"


def level(**fields):
    base = dict(concurrency=4, request_rate=None, requests=24, warmup_requests=2, prompt_tokens=128, output_tokens=64)
    return SimpleNamespace(**{**base, **fields})


def test_a_closed_loop_is_paced_and_a_rate_is_passed_as_asked(tmp_path):
    cmd = loadgen.command(Path("aiperf"), "http://127.0.0.1:9", level(), tmp_path / "tok", tmp_path / "out", "m")
    at = {flag: cmd[i + 1] for i, flag in enumerate(cmd[:-1]) if flag.startswith("--")}
    assert at["--concurrency"] == "4" and at["--request-count"] == "24" and at["--request-rate"] == "100.0"
    assert at["--synthetic-input-tokens-mean"] == "128" and at["--output-tokens-mean"] == "64"
    assert at["--extra-inputs"] == "ignore_eos:true" and at["--connection-reuse-strategy"] == "never"
    paced = loadgen.command(Path("aiperf"), "u", level(request_rate=2.5), tmp_path, tmp_path, "m")
    assert paced[paced.index("--request-rate") + 1] == "2.5"


def test_the_export_becomes_serve_metrics(tmp_path):
    shutil.copy(EXPORT, tmp_path / "profile_export_aiperf.json")
    got = loadgen.results(tmp_path)
    data = json.loads(EXPORT.read_text())
    assert got["serve_output_tokens_per_s"] == data["output_token_throughput"]["avg"]
    assert got["serve_ttft_ms_p99"] == data["time_to_first_token"]["p99"]
    assert got["serve_tpot_ms_p50"] == data["inter_token_latency"]["p50"]
    assert got["serve_itl_ms_p90"] == data["inter_chunk_latency"]["p90"]
    assert got["serve_e2e_ms_p50"] == data["request_latency"]["p50"]
    assert got["serve_errors"] == 0.0 and got["serve_requests"] == data["completed_request_count"]["avg"]


def test_an_export_that_is_missing_is_one_line_naming_the_log(tmp_path):
    with pytest.raises(loadgen.LoadGenError, match="aiperf wrote no results") as err:
        loadgen.results(tmp_path)
    assert "\n" not in str(err.value)


def test_an_executable_named_by_the_environment_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTSPEC_AIPERF", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="QUANTSPEC_AIPERF=.* is not a file"):
        loadgen.aiperf(tmp_path)
    (tmp_path / "aiperf").write_text("")
    monkeypatch.setenv("QUANTSPEC_AIPERF", str(tmp_path / "aiperf"))
    assert loadgen.aiperf(tmp_path) == tmp_path / "aiperf"
