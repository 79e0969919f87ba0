"""task=serve's load generator (src.tasks.loadgen): its command line for a level, and its results read from
aiperf's own JSON export (tests/tasks/data/aiperf_export.json: the figures' keys of a real aiperf 0.13 run
against quantspec's server: the chat endpoint, the seed prompts, goodput's targets)."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from src.data import prompts
from src.tasks import loadgen

EXPORT = Path(__file__).parent / "data" / "aiperf_export.json"


def level(**fields):
    base = dict(
        concurrency=4, request_rate=None, requests=24, warmup_requests=2, prompt_tokens=128, output_tokens=64,
        endpoint="completions", slo_ttft_ms=None, slo_tpot_ms=None, slo_e2e_ms=None,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **fields})


def test_a_closed_loop_is_paced_and_a_rate_is_passed_as_asked(tmp_path):
    cmd = loadgen.command(Path("aiperf"), "http://127.0.0.1:9", level(), tmp_path / "tok", tmp_path / "out", "m")
    at = {flag: cmd[i + 1] for i, flag in enumerate(cmd[:-1]) if flag.startswith("--")}
    assert at["--concurrency"] == "4" and at["--request-count"] == "24" and at["--request-rate"] == "100.0"
    assert at["--synthetic-input-tokens-mean"] == "128" and at["--output-tokens-mean"] == "64"
    assert at["--extra-inputs"] == "ignore_eos:true" and at["--connection-reuse-strategy"] == "never"
    paced = loadgen.command(Path("aiperf"), "u", level(request_rate=2.5), tmp_path, tmp_path, "m")
    assert paced[paced.index("--request-rate") + 1] == "2.5"
    assert "--goodput" not in cmd and "--input-file" not in cmd and at["--endpoint-type"] == "completions"


def test_targets_become_aiperfs_goodput_and_a_prompts_file_its_input(tmp_path):
    task = level(endpoint="chat", slo_ttft_ms=500.0, slo_tpot_ms=40.0)
    cmd = loadgen.command(Path("aiperf"), "u", task, tmp_path, tmp_path, "m", tmp_path / "p.jsonl")
    at = {flag: cmd[i + 1] for i, flag in enumerate(cmd[:-1]) if flag.startswith("--")}
    assert at["--goodput"] == "time_to_first_token:500 inter_token_latency:40"
    assert at["--input-file"] == str(tmp_path / "p.jsonl") and at["--custom-dataset-type"] == "single_turn"
    assert at["--endpoint-type"] == "chat" and "--synthetic-input-tokens-mean" not in cmd


def test_a_prompts_file_sends_plain_prompts_as_text_and_chats_as_their_messages(tmp_path):
    chat = prompts.Prompt(2, messages=(("system", "Be brief."), ("user", "What is recursion?")))
    lines = [
        json.loads(x) for x in loadgen.prompts_file(["Hello", chat], True, 32, tmp_path / "p").read_text().splitlines()
    ]
    assert lines[0] == {"output_length": 32, "text": "Hello"}
    assert lines[1]["text"] == "What is recursion?" and lines[1]["output_length"] == 32
    assert lines[1]["extra"]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is recursion?"},
    ]
    with pytest.raises(ValueError, match="chat endpoint only"):
        loadgen.prompts_file([chat], False, 32, tmp_path / "q")


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
    assert got["serve_ttft_ms_p95"] == data["time_to_first_token"]["p95"]
    assert got["serve_goodput_per_s"] == data["goodput"]["avg"]
    assert got["serve_good_fraction"] == data["good_request_fraction"]["avg"]


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


def _export(tmp_path, **changes):
    data = json.loads(EXPORT.read_text())
    for key, value in changes.items():
        metric, stat = key.split("__")
        data[metric][stat] = value
    text = json.dumps(data).replace('"__nan__"', "NaN").replace('"__inf__"', "Infinity")
    (tmp_path / "profile_export_aiperf.json").write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"output_token_throughput__avg": "__nan__"}, "output_token_throughput avg is nan"),
        ({"request_throughput__avg": "__inf__"}, "request_throughput avg is inf"),
        ({"time_to_first_token__p99": -3.0}, "time_to_first_token p99 is -3.0"),
        ({"completed_request_count__avg": 0}, "no request completed"),
    ],
    ids=["nan", "infinite", "negative", "none-completed"],
)
def test_a_figure_that_is_no_measurement_fails_the_level_in_one_line(tmp_path, changes, words):
    with pytest.raises(loadgen.LoadGenError, match=words) as err:
        loadgen.results(_export(tmp_path, **changes))
    assert "\n" not in str(err.value)


def test_a_load_generator_stopped_midway_is_ended_within_seconds_with_its_reason(tmp_path):
    import sys
    import time

    stops_itself = [
        sys.executable,
        "-c",
        "import os, signal, time; os.kill(os.getpid(), signal.SIGSTOP); time.sleep(60)",
    ]
    began = time.monotonic()
    with pytest.raises(loadgen.LoadGenError, match=r"aiperf was stopped \(SIGSTOP"):
        loadgen.run(stops_itself, tmp_path / "log", lambda: None)
    assert time.monotonic() - began < 30


def test_a_server_that_dies_under_the_load_fails_the_level_and_ends_the_generator(tmp_path):
    import sys
    import time

    sleeper = [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)"]
    deaths = iter([None, None, "(llama-server) exited -9: killed"])
    began = time.monotonic()
    with pytest.raises(loadgen.LoadGenError, match=r"the server \(llama-server\) exited -9: killed during the load"):
        loadgen.run(sleeper, tmp_path / "log", lambda: next(deaths))
    assert time.monotonic() - began < 20 and "loading" in (tmp_path / "log").read_text()
