"""A runtime added as the docs' recipe says (docs/how-to/add-runtime.md), from outside the repository's conf/ (tests/engine/runtimes/test_runtime_recipe.py
writes its YAML): torch's forward over the whole sequence at every token, no KV cache. Slow and simple,
so the test shows what the registry needs of a runtime and nothing more."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from src.engine.generation import Generation, Request
from src.engine.runtimes.exports import cached
from src.engine.runtimes.isolated import Maker

TITLE = "example runtime"  # its name in a failure line


def crash_hint() -> str:
    """Nothing known to do about a crash of its native code on a particular host."""
    return ""


def unsupported(cfg) -> str | None:
    """It runs the job's torch weights as they are: fp32, one token at a time."""
    if cfg.precision.name != "fp32":
        return f"engine example runs fp32 only, not {cfg.precision.name}"
    return None


def runtime_name(cfg, device: str) -> str:
    return f"example: torch {torch.__version__} forward without a cache, {device}"


def build(cfg, loaded, placement, corpus, recorder):
    """Its export: the job's weights as safetensors (cached, as every runtime's export is), loaded by torch in
    the runtime's own process (src.engine.runtimes.isolated)."""
    recorder.set_tags({"kernels": "example", "kernels_isa": "", "kernels_note": ""})
    folder = cached(
        Path(cfg.cache_dir) / "example" / loaded.source_key,
        {"source": loaded.source_key},
        lambda work: loaded.model.save_pretrained(work / "model"),
        "example",
    )
    return Maker("tests.support.example_runtime:NoCache", folder)


class NoCache:
    def __init__(self, folder: Path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    @torch.inference_mode()
    def window_score(self, ids, indices=None):
        from src.quality.scoring import score_logits

        logits = self.model(ids[None]).logits[0]
        if os.environ.get("EXAMPLE_RUNTIME_NAN"):  # as a damaged export's weights give (a test's case)
            logits = torch.full_like(logits, float("nan"))
        return score_logits(logits, ids, indices)

    @torch.inference_mode()
    def __call__(self, model, request: Request) -> Generation:
        input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
        ids, new, times = input_ids, [], []
        start = time.perf_counter()
        while len(new) < max_new_tokens:
            token = int(self.model(ids).logits[0, -1].argmax())  # greedy, as the test runs it
            times.append(time.perf_counter())
            new.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            if stop is not None and stop(new):
                break
        return Generation(input_ids.shape[1], new, start, times, time.perf_counter())
