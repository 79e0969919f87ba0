"""The reference a job's quality is measured against: the same weights in a float precision (fp32, or bf16
where fp32 does not fit), run by torch, computed once and cached.

Two caches, each a directory under <cache_dir>/reference/ holding safetensors or JSON with a manifest
(sha256 of each file, checked before use; src.common.cache), keyed by the model's exact
weights, the reference precision and exactly what was scored:
- windows: per position, the reference's top-k next tokens and their log-probs, and the log-prob of the
  token that came (src.quality.divergence says what the cut to k costs);
- continuations: the reference's greedy continuation of each prompt.
A job loads its own copy of the reference model only to fill a cache it does not find.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from src.common.cache import build_cached
from src.common.paths import child
from src.models.config import ModelConfig
from src.models.load import load_model
from src.quality.scoring import ReferenceWindow, reference_window

log = logging.getLogger("quantspec")

REFERENCES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # task.reference: none turns it off
FORMAT = 1


def _digest(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass
class Reference:
    model: ModelConfig
    cache_dir: Path
    precision: str  # a key of REFERENCES
    top_k: int
    source_key: str  # the model's exact weights (LoadedModel.source_key)

    def describe(self, vocab: int | None = None) -> str:
        cut = (
            ""
            if vocab is None
            else (f", top-{min(self.top_k, vocab)} of {vocab} tokens" if self.top_k < vocab else ", full vocabulary")
        )
        return f"{self.model.name} {self.precision} (torch{cut})"

    def _directory(self, kind: str, payload) -> Path:
        key = _digest(
            {"format": FORMAT, "source": self.source_key, "reference": self.precision, "kind": kind, "what": payload}
        )
        return child(self.cache_dir / "reference", f"{self.model.name}-{self.precision}-{kind}-{key[:16]}")

    def _model(self):
        loaded = load_model(self.model, self.cache_dir, dtype=REFERENCES[self.precision])  # never a wider copy
        if loaded.source_key != self.source_key:  # the cache's key would lie about what was scored
            raise RuntimeError(f"the reference loaded {loaded.source_key}, not the job's {self.source_key}")
        return loaded.model.to(REFERENCES[self.precision]).eval()

    def windows_cache(self, chunks: list[torch.Tensor]) -> Path:
        """Where the reference's view of these windows is cached."""
        return self._directory("windows", {"top_k": self.top_k, "windows": [c.tolist() for c in chunks]})

    def windows(self, chunks: list[torch.Tensor]) -> tuple[list[ReferenceWindow], Path]:
        """The reference's view of each window (equal lengths), from the cache or computed now."""
        directory = self.windows_cache(chunks)

        @torch.inference_mode()
        def build(tmp: Path) -> None:
            log.info("reference %s: scoring %d windows once (cached in %s)", self.precision, len(chunks), directory)
            model = self._model()
            refs = [reference_window(model(input_ids=c[None]).logits[0], c, self.top_k) for c in chunks]
            del model
            gc.collect()
            save_file(
                {
                    "indices": torch.stack([r.indices for r in refs]).to(torch.int32),
                    "logp": torch.stack([r.logp for r in refs]).contiguous(),
                    "target_logp": torch.stack([r.target_logp for r in refs]).contiguous(),
                },
                str(tmp / "windows.safetensors"),
                metadata={"vocab": str(refs[0].vocab)},
            )

        build_cached(directory, build, {"reference": self.precision, "source": self.source_key}, "reference")
        with safe_open(str(directory / "windows.safetensors"), "pt") as f:  # one read: metadata and tensors
            vocab = int(f.metadata()["vocab"])
            t = {name: f.get_tensor(name) for name in f.keys()}
        return [
            ReferenceWindow(t["indices"][i].long(), t["logp"][i], t["target_logp"][i], vocab)
            for i in range(len(chunks))
        ], directory

    def continuations(self, prompts: list[torch.Tensor], new_tokens: int) -> list[list[int]]:
        """The reference's greedy continuation of each prompt ((1, n) ids), exactly new_tokens long."""
        payload = {"new_tokens": new_tokens, "prompts": [p[0].tolist() for p in prompts]}
        directory = self._directory("continuations", payload)

        @torch.inference_mode()
        def build(tmp: Path) -> None:
            log.info(
                "reference %s: greedy continuations of %d prompts once (cached in %s)",
                self.precision,
                len(prompts),
                directory,
            )
            model = self._model()
            out = []
            for p in prompts:
                ids = model.generate(
                    p,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    attention_mask=torch.ones_like(p),
                    pad_token_id=0,
                )
                out.append(ids[0, p.shape[1] :].tolist())
            del model
            gc.collect()
            (tmp / "continuations.json").write_text(json.dumps(out))

        build_cached(directory, build, {"reference": self.precision, "source": self.source_key}, "reference")
        return json.loads((directory / "continuations.json").read_text())
