"""A built kernel library is loaded only if its bytes are the ones recorded when it was built (src/kernels
`_recorded`, run for the binding and for every variant before a load): every way the pair can be damaged reads
as "build it again", never as an error or a load. No compiler here: the library is any file; a real build
damaged and rebuilt is tests/e2e/test_faults.py's."""

import logging
from pathlib import Path

import pytest

from src import kernels
from src.kernels import loader


@pytest.fixture
def library(tmp_path) -> Path:
    built = tmp_path / "qs_avx2.so"
    built.write_bytes(bytes(range(256)) * 64)
    loader._record(built)  # as a build records it
    return built


def test_a_whole_library_with_its_record_is_loaded(library):
    assert loader._recorded(library)


def test_a_truncated_library_is_rebuilt_and_said(library, caplog):
    with library.open("r+b") as f:
        f.truncate(library.stat().st_size // 2)
    with caplog.at_level(logging.WARNING, logger="src.kernels"):
        assert not loader._recorded(library)
    assert "qs_avx2.so does not match its recorded sha256; rebuilding it" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="src.kernels"):
        assert not loader._recorded(library, warn=False)  # the check outside the build lock says nothing
    assert caplog.text == ""


@pytest.mark.parametrize("record", ["[1]", "null", '"a string"', "{", "\xff", '{"torch": "2.13.0"}'])
def test_a_record_that_is_no_record_is_rebuilt_like_a_damaged_library(library, record, caplog):
    (library.parent / kernels.RECORD).write_bytes(record.encode("latin-1"))
    with caplog.at_level(logging.WARNING, logger="src.kernels"):
        assert not loader._recorded(library)
    assert "does not match its recorded sha256" in caplog.text


def test_a_library_or_record_missing_is_built_without_a_word(library, caplog):
    (library.parent / kernels.RECORD).unlink()
    with caplog.at_level(logging.WARNING, logger="src.kernels"):
        assert not loader._recorded(library)
        assert not loader._recorded(library.with_name("qs_reference.so"))
    assert caplog.text == ""
