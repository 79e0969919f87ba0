"""A built kernel library sits in the one verified cache (src.common.cache) and is loaded only while its bytes are
those recorded when it was built: every way the library or its manifest can be damaged reads as "build it again"
with one line, never as an error or a load. The compiler is stood in for by a writer of fixed bytes; a real build
damaged, killed and raced is tests/e2e/test_build_faults.py's."""

import json
import logging

import pytest

from src.common.cache import MANIFEST
from src.kernels import loader, variants

BYTES = bytes(range(256)) * 64


@pytest.fixture
def built(tmp_path, monkeypatch):
    """(build, count): build() makes the reference variant's library under tmp_path; count[0] the compiles."""
    count = [0]

    def compile_variant(variant, out, cxx):
        count[0] += 1
        out.write_bytes(BYTES)

    monkeypatch.setattr(variants, "compile_variant", compile_variant)
    monkeypatch.setattr(variants, "compiler", lambda: "c++")
    return (lambda: loader.built_variant(variants.by_name("reference"), tmp_path)), count


def test_a_whole_library_with_its_manifest_is_used_as_it_is(built):
    build, count = built
    library = build()
    assert library.read_bytes() == BYTES and build() == library and count[0] == 1
    assert json.loads((library.parent / MANIFEST).read_text())["files"][library.name]["bytes"] == len(BYTES)


def test_a_truncated_library_is_rebuilt_and_said(built, caplog):
    build, count = built
    library = build()
    with library.open("r+b") as f:
        f.truncate(len(BYTES) // 2)
    with caplog.at_level(logging.WARNING, logger="quantspec"):
        assert build().read_bytes() == BYTES and count[0] == 2
    assert f"{library.name} has {len(BYTES) // 2} bytes, expected {len(BYTES)}" in caplog.text


def test_a_library_of_other_bytes_is_rebuilt_and_said(built, caplog):
    build, count = built
    library = build()
    library.write_bytes(BYTES[::-1])  # the same size, other bytes
    with caplog.at_level(logging.WARNING, logger="quantspec"):
        assert build().read_bytes() == BYTES and count[0] == 2
    assert f"{library.name} does not match its recorded sha256" in caplog.text


@pytest.mark.parametrize("manifest", ["[1]", "null", '"a string"', "{", "\xff", '{"format": 2}'])
def test_a_manifest_that_is_no_manifest_is_rebuilt_like_a_damaged_library(built, manifest, caplog):
    build, count = built
    library = build()
    (library.parent / MANIFEST).write_bytes(manifest.encode("latin-1"))
    with caplog.at_level(logging.WARNING, logger="quantspec"):
        assert build().read_bytes() == BYTES and count[0] == 2
    assert "kernel library" in caplog.text and "is rebuilt" in caplog.text


def test_a_library_never_built_is_built_without_a_word(built, caplog):
    build, count = built
    with caplog.at_level(logging.WARNING, logger="quantspec"):
        build()
    assert count[0] == 1 and caplog.text == ""
