"""The export cache every runtime shares (src.engine.runtimes.cached and cached_export): built once in a
scratch folder, kept while its manifest matches, and a failure is one line that leaves nothing behind."""

import sys

import pytest

from src.engine.runtimes import cached, cached_export
from src.assembly.tiny import tiny_model


def test_an_export_is_built_once_and_a_failed_one_leaves_no_cache(tmp_path):
    calls = []

    def build(work):
        calls.append(work)
        (work / "model").mkdir()
        (work / "model" / "weights.bin").write_text("w")

    out = tmp_path / "rt" / "key"
    assert cached(out, {"v": 1}, build, "test") == out and (out / "weights.bin").read_text() == "w"
    assert cached(out, {"v": 1}, build, "test") == out and len(calls) == 1        # cached
    assert cached(out, {"v": 2}, build, "test") == out and len(calls) == 2        # another manifest: rebuilt

    def fail(work):
        (work / "model").mkdir()
        raise RuntimeError("the test export failed: no")
    with pytest.raises(RuntimeError, match="^the test export failed: no$"):
        cached(tmp_path / "rt" / "other", {"v": 1}, fail, "test")
    assert sorted(p.name for p in (tmp_path / "rt").iterdir()) == ["key"]       # no scratch, no half cache


def test_an_exporter_process_that_fails_is_its_last_line(tmp_path):
    model, tok = tiny_model("llama")
    command = lambda work: [sys.executable, "-c", "import sys; print('a'); sys.exit('the builder said no')"]  # noqa: E731
    with pytest.raises(RuntimeError, match="^the Example export failed: the builder said no$"):
        cached_export(tmp_path / "x" / "key", {"v": 1}, model, tok, command, "Example")
    assert list((tmp_path / "x").iterdir()) == []
