"""A model of the user's own: by hub id (read offline from a Hugging Face cache laid out as the hub lays it, built
here from a tiny model), by a GGUF file, and a family quantspec's engine does not map, which runs on transformers'
generate with its line. Each runs as a user runs it: `python -m src.run model=hub model.id=...`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests.support.cli import ROOT, cli_env, fresh_cache, run_cli
from tests.support.models import publish_to_hub_cache, write_tiny_gguf

QUICK = ["task=decode", "task.limit=1", "task.max_new_tokens=3", "task.warmup=0", "report_at_end=false"]


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of the test's own, read offline (huggingface_hub reads both at each call)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def _run(tmp_path, *args: str):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [*QUICK, f"tracking.uri={store}", f"hydra.run.dir={tmp_path / 'out'}", *args],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("quantspec")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return out, runs


def _quantspec_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("quantspec:")]


def test_a_hub_id_runs_offline_from_the_hub_cache_on_quantspecs_engine(tmp_path, hub_cache):
    from src.models.tiny import tiny_model

    publish_to_hub_cache(hub_cache, "quantspec-test/tiny-qwen2", *tiny_model("qwen2"))
    out, (run,) = _run(tmp_path, "model=hub", "model.id=quantspec-test/tiny-qwen2")
    assert out.returncode == 0, out.stderr[-2000:]
    tags, params = run.data.tags, run.data.params
    assert tags["outcome"] == "finished" and tags["model"] == "quantspec-test--tiny-qwen2"
    # its family read from its own config.json: quantspec's engine and kernels run it, with no note
    assert params["model.arch"] == "qwen2" and params["model.model_type"] == "qwen2"
    assert tags["engine"] == "native" and tags["engine_note"] == ""
    assert params["executed.kernels"].startswith("quantspec/")
    assert params["model.name"] == "quantspec-test--tiny-qwen2"


def test_a_model_of_another_family_runs_on_transformers_generate_and_says_why(tmp_path, hub_cache):
    from transformers import GPT2Config, GPT2LMHeadModel

    from src.models.tiny import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=64, n_layer=2, n_head=2)
    publish_to_hub_cache(hub_cache, "quantspec-test/tiny-gpt2", GPT2LMHeadModel(config), tokenizer)
    out, (run,) = _run(tmp_path, "model=hub", "model.id=quantspec-test/tiny-gpt2")
    assert out.returncode == 0, out.stderr[-2000:]
    tags, params = run.data.tags, run.data.params
    assert tags["outcome"] == "finished" and params["model.arch"] == "other"
    assert tags["engine"] == "hf" and params["engine.kind"] == "hf" and params["choice.engine"] == "hf"
    note = tags["engine_note"]
    assert "quantspec-test--tiny-gpt2 is a gpt2" in note and "engine=hf" in note
    assert note in out.stdout + out.stderr  # said where the user reads it, in one line
    # a quantized precision needs its layers mapped: refused in one line, before any run
    out, runs = _run(tmp_path / "w8a8", "model=hub", "model.id=quantspec-test/tiny-gpt2", "precision=w8a8")
    (line,) = _quantspec_lines(out.stderr)
    assert out.returncode == 1 and "is quantized only where quantspec maps its layers" in line and not runs


def test_a_model_that_cannot_be_read_is_refused_in_one_line(tmp_path, hub_cache):
    cases = [
        (["model=hub", "model.id=nobody/nothing"], "its config.json is not in the Hugging Face cache"),
        (["model=hub"], "model=hub needs model.id=org/name"),
        (["model=gguf", f"model.gguf={tmp_path / 'none.gguf'}"], "none.gguf is not a file"),
        (["model=hub", f"model.local_path={tmp_path}"], "has no config.json"),
    ]
    for i, (args, said) in enumerate(cases):
        out, runs = _run(tmp_path / str(i), *args)
        (line,) = _quantspec_lines(out.stderr)
        assert out.returncode == 1 and said in line and not runs, (args, out.stderr[-1500:])


def test_a_local_gguf_file_runs(tmp_path):
    gguf = tmp_path / "My-Qwen.gguf"
    write_tiny_gguf(gguf)
    out, (run,) = _run(tmp_path, "model=gguf", f"model.gguf={gguf}")
    assert out.returncode == 0, out.stderr[-2000:]
    tags, params = run.data.tags, run.data.params
    assert tags["outcome"] == "finished" and tags["model"] == "My-Qwen" and tags["engine"] == "native"
    assert params["model.arch"] == "qwen2" and params["model.model_type"] == "qwen2"


def _folder_asking_for_its_code(folder, marker):
    """A tiny qwen2 folder whose tokenizer_config.json names a tokenizer class in the folder's own Python, which
    writes `marker` when imported: what would show that quantspec ran the folder's code."""
    import json

    from src.models.tiny import tiny_model

    model, tokenizer = tiny_model("qwen2")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return folder


def test_a_folder_that_asks_to_run_its_own_code_is_refused_in_one_line_and_its_code_never_runs(tmp_path):
    """As a real process with `y` piped into its stdin: the job reads nothing there and runs nothing of the folder's;
    src.run and src.serve both refuse it in one line naming the file and auto_map."""
    marker = tmp_path / "ran"
    folder = _folder_asking_for_its_code(tmp_path / "own", marker)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))}
    args = ["model=hub", f"model.local_path={folder}", f"hydra.run.dir={tmp_path / 'out'}"]
    for module, extra in (("src.run", [*QUICK, f"tracking.uri={store}"]), ("src.serve", ["task.port=0"])):
        out = subprocess.run(
            [sys.executable, "-m", module, *extra, *args], input="y\ny\n", capture_output=True, text=True,
            timeout=300, env=cli_env(env), cwd=ROOT,
        )  # fmt: skip
        lines = _quantspec_lines(out.stderr)
        assert out.returncode in (1, 2) and len(lines) == 1, (module, out.stderr[-2000:])
        assert "tokenizer_config.json asks to run the model's own code (auto_map)" in lines[0], lines[0]
        assert not marker.exists()


def test_python_m_src_serve_reads_a_model_of_ones_own_as_src_run_does(tmp_path):
    from src.assembly.composed import job_config
    from src.models.tiny import tiny_model

    model, tokenizer = tiny_model("qwen2")
    model.save_pretrained(tmp_path / "own")
    tokenizer.save_pretrained(tmp_path / "own")
    cfg = job_config(["task=serve", "model=hub", f"model.local_path={tmp_path / 'own'}"])
    assert cfg.model.arch == "qwen2" and cfg.unsupported_reason() is None


def test_a_folder_whose_sizes_would_not_fit_is_refused_before_anything_is_built(tmp_path):
    """num_hidden_layers: 1000000 with every other size tiny: counted from config.json (a meta model of it takes
    minutes and gigabytes), refused in one line within seconds, with what it needs and what is free."""
    import json
    import time

    from src.models.tiny import tiny_model

    model, tokenizer = tiny_model("qwen2")
    model.save_pretrained(tmp_path / "own")
    tokenizer.save_pretrained(tmp_path / "own")
    config = json.loads((tmp_path / "own" / "config.json").read_text())
    config["num_hidden_layers"] = 1_000_000
    config["intermediate_size"] = 4096
    (tmp_path / "own" / "config.json").write_text(json.dumps(config))
    began = time.monotonic()
    out, runs = _run(tmp_path, "model=hub", f"model.local_path={tmp_path / 'own'}")
    (line,) = _quantspec_lines(out.stderr)
    assert out.returncode == 1 and "GB of memory and" in line and "is available" in line, out.stderr[-2000:]
    assert time.monotonic() - began < 60


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ("heads", "its weights do not have the shapes"),
        ("tokenizer", "its tokenizer (tokenizer.json, tokenizer_config.json in"),
    ],
    ids=["config-weights-mismatch", "damaged-tokenizer"],
)
def test_a_folder_whose_files_do_not_load_is_one_line_naming_the_file_and_what_to_do(tmp_path, damage, words):
    import json

    from src.models.tiny import tiny_model

    folder = tmp_path / "own"
    model, tokenizer = tiny_model("qwen2")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if damage == "heads":  # sizes that build other shapes than the weights have
        config = json.loads((folder / "config.json").read_text())
        config["num_attention_heads"] = 3
        (folder / "config.json").write_text(json.dumps(config))
    else:
        (folder / "tokenizer.json").write_text('{"trunc')
    out, _ = _run(tmp_path, "model=hub", f"model.local_path={folder}")
    (line,) = _quantspec_lines(out.stderr)
    assert out.returncode == 1 and words in line and "restore" in line and "above report" not in line, line
