"""Corpora and prompts: HumanEval offline, text files with their failures named."""

import pytest

from src.data.config import DatasetConfig
from src.data.corpus import SEED_PROMPTS, DatasetUnavailable, code_prompts, load_text


def test_humaneval_ships_offline():
    text = load_text(DatasetConfig("humaneval", "humaneval"))
    assert "def " in text and len(text) > 100_000
    assert len(code_prompts()) == 13 and all(
        p.lstrip().startswith(("def ", "from ", "import ")) for p in code_prompts()
    )
    assert len(SEED_PROMPTS) == 10


def test_a_text_file_is_read_and_its_problems_named(tmp_path):
    good = tmp_path / "c.txt"
    good.write_text("héllo\n", encoding="utf-8")
    assert load_text(DatasetConfig("t", "textfile", path=str(good))) == "héllo\n"
    with pytest.raises(DatasetUnavailable, match="is not a file"):
        load_text(DatasetConfig("t", "textfile", path=str(tmp_path / "none.txt")))
    bad = tmp_path / "b.txt"
    bad.write_bytes(b"\xff\xfe abc")
    with pytest.raises(DatasetUnavailable, match=r"is not UTF-8 text \(byte 0xff at offset 0\)"):
        load_text(DatasetConfig("t", "textfile", path=str(bad)))
