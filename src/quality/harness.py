"""quantspec's model as lm-evaluation-harness's LM: its loglikelihoods from the job's own scoring (the
quantized model on quantspec's kernels, or another runtime's logits), its generations from the job's engine.

lm-eval asks three things (lm_eval.api.model.LM):
- loglikelihood((context, continuation)) -> (log P(continuation | context), whether greedy decoding would
  produce it): one forward over BOS + context + continuation;
- loglikelihood_rolling((text,)) -> log P(text): the text in windows of the model's context, each token
  predicted once;
- generate_until((context, {"until": [...], "max_gen_toks": n})) -> text: greedy, through the job's engine.
Tokens as lm-eval's own HF model cuts them: the context's trailing spaces move to the continuation, and the
continuation's tokens are those of context+continuation past the context's.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch

from src.data.corpus import bos_prefix

LOCAL_TASKS = Path(__file__).parent / "lm_eval_tasks"  # tasks defined from this repository's files
VERSION = "0.4.13"  # pinned (pyproject.toml): its task definitions and metrics are part of every figure


def unavailable() -> str | None:
    """Why task=lm_eval cannot run here, in one line, or None."""
    if importlib.util.find_spec("lm_eval") is None:
        return f"task=lm_eval needs lm-evaluation-harness: .venv/bin/pip install lm-eval=={VERSION} (scripts/setup installs it)"
    return None


class _Requests:
    """lm-eval's three kinds of request answered through quantspec's scoring and generation (the LM class
    itself is made in make_lm: lm-eval is an optional extra)."""

    def __init__(self, score: Callable, tokenizer, max_context: int, generate: Callable | None, max_new_tokens: int):
        self.score, self.tokenizer, self.max_context = score, tokenizer, max_context
        self.generate, self.max_new_tokens = generate, max_new_tokens
        # what every scored sequence starts with: BOS where the model expects one, else EOS (as lm-eval's
        # HF model does), so that the first real token is predicted too
        self.prefix = bos_prefix(tokenizer) or [tokenizer.eos_token_id]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, head = self._encode(context + continuation), self._encode(context)
        return head, whole[len(head) :]

    def _score(self, ids: list[int], n: int) -> tuple[float, bool]:
        """(log P of ids' last n tokens given what precedes them, whether each is the top token)."""
        s = self.score(torch.tensor(ids), None)
        target = torch.tensor(ids[-n:])
        return float(s.target_logp[-n:].double().sum()), bool((s.top1[-n:] == target).all())

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        out = []
        for r in requests:
            head, tail = self._split(*r.args)
            # the context cut from the left to the model's context, as lm-eval does
            out.append(self._score((self.prefix + head + tail)[-self.max_context :], len(tail)))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        out = []
        for r in requests:
            tokens, total, start = self._encode(r.args[0]), 0.0, 0
            while start < len(tokens):  # each window's context: the token before it (the prefix first)
                end = min(len(tokens), start + self.max_context - 1)
                before = self.prefix if start == 0 else tokens[start - 1 : start]
                total += self._score(before + tokens[start:end], end - start)[0]
                start = end
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False):
        if self.generate is None:
            raise RuntimeError("this engine cannot generate for lm-eval")
        out = []
        for r in requests:
            context, kwargs = r.args
            until = [u for u in (kwargs.get("until") or []) if u]
            n = int(kwargs.get("max_gen_toks", self.max_new_tokens))
            ids = torch.tensor([(self.prefix + self._encode(context))[-(self.max_context - n) :]])

            def stop(new: list[int], until=until) -> bool:  # bound now: a request's own stop strings
                text = self.tokenizer.decode(new, skip_special_tokens=True)
                return any(u in text for u in until)

            text = self.tokenizer.decode(self.generate(ids, n, stop), skip_special_tokens=True)
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        return out


def make_lm(score: Callable, tokenizer, max_context: int, generate: Callable | None = None, max_new_tokens: int = 60):
    """An lm_eval LM over `score(ids, None) -> WindowScore` (src.quality.scoring) and, for generate_until,
    `generate(ids (1, n), max_new_tokens, stop) -> new token ids`."""
    from lm_eval.api.model import LM  # here: lm-eval is an optional extra

    class QuantspecLM(_Requests, LM):
        def __init__(self):
            LM.__init__(self)
            _Requests.__init__(self, score, tokenizer, max_context, generate, max_new_tokens)

    return QuantspecLM()
