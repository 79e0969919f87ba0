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


def _bpe(text: str):
    """A byte-level BPE tokenizer trained here on `text` (merges across characters, as real vocabularies have)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([text[:200_000]], trainers.BpeTrainer(vocab_size=2000, show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_the_start_of_a_corpus_tokenizes_as_the_whole_does_reading_only_what_it_needs():
    from src.data.corpus import leading_ids

    text = load_text(DatasetConfig("humaneval", "humaneval"))
    tok = _bpe(text)
    whole = tok(text, add_special_tokens=False).input_ids
    read = []

    class Counting:
        def __call__(self, part, add_special_tokens=False):
            read.append(len(part))
            return tok(part, add_special_tokens=add_special_tokens)

    for needed in (1, 128, 511, 4096):
        got = leading_ids(Counting(), text, needed)
        assert len(got) >= needed and got == whole[: len(got)]
    assert max(read) < len(text) // 4  # never the whole corpus for a few thousand tokens
    assert leading_ids(tok, "a short text", 10_000) == tok("a short text", add_special_tokens=False).input_ids


def test_calibration_over_a_large_corpus_tokenizes_a_slice_of_its_second_half(monkeypatch):
    from src.quant import calibrate

    text = load_text(DatasetConfig("humaneval", "humaneval"))
    tok = _bpe(text)
    small = calibrate.calibration_ids(tok, text, 4, 64)  # a corpus under the bound: as before, the whole
    whole = tok(text, add_special_tokens=False).input_ids
    assert small[0].tolist() == whole[len(whole) // 2 : len(whole) // 2 + 64]
    read = []

    class Counting:
        def __call__(self, part, add_special_tokens=False):
            read.append(part)
            return tok(part, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(calibrate, "CALIB_MAX_CHARS", 20_000)
    big = calibrate.calibration_ids(Counting(), text, 4, 64)
    (part,) = read
    assert len(part) <= 20_000 and text.index(part) >= len(text) // 2  # never the evaluated first half
    assert big.shape == (4, 64)


def test_a_prompts_file_is_read_as_text_but_calibration_reads_the_default_corpus():
    from src.data.corpus import CALIBRATION_DEFAULT, Corpus

    corpus = Corpus(DatasetConfig("jsonl", "jsonl", path="examples/prompts.jsonl"))
    assert "What is recursion?" in corpus.reader("evaluation")()
    assert corpus.reader("calibration")() == load_text(CALIBRATION_DEFAULT)
    assert {name for text, name in corpus.used()} == {"evaluation", "calibration"} and len(corpus.used()) == 2
