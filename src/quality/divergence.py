"""How far a model departs from its reference: KL divergence, top-1 agreement, Δ perplexity (window scoring),
and the first divergent token and share of divergent tokens (generation).

KL divergence from a cut reference. The reference keeps its k most likely tokens per position and the
mass r it gives the rest. The KL computed here is that of the two distributions coarsened to those k
tokens plus one "everything else" bucket (r for the reference, 1 − Σ q over the k for the model):

    KL_k = Σ_top-k p (log p − log q) + r log(r / q_rest)

By the data-processing inequality KL_k ≤ KL, and KL − KL_k = r · KL(p_rest/r ‖ q_rest/q_rest-mass): only
how the model spreads the reference's own tail mass r among the tail's tokens goes uncounted. With k equal
to the vocabulary it is exact. The mean r is logged (kl_tail_mass) so the reader sees how much was cut.

Generation (Divergent Token Metrics, as OpenVINO's who_what_benchmark reports them): the model is run
teacher-forced on the reference's greedy continuation of each prompt, so that every position is compared on
the same prefix; a position diverges where the model's top token is not the reference's. First divergent
token: the first such position (the continuation's length where there is none); share: their fraction.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from src.quality import stats
from src.quality.scoring import ReferenceWindow, WindowScore


def kl_per_token(ref: ReferenceWindow, score: WindowScore) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL_k per position, the reference's tail mass r per position), in float64."""
    logp, logq = ref.logp.double(), score.logp_at.double()
    p = logp.exp()
    kl = (p * (logp - logq)).sum(-1)
    if ref.indices.shape[-1] >= ref.vocab:  # nothing cut: the sum is the whole KL
        return kl, torch.zeros_like(kl)
    r = (1 - p.sum(-1)).clamp(min=0.0)
    q_rest = (1 - logq.exp().sum(-1)).clamp(min=1e-300)
    tail = torch.where(r > 0, r * (r.clamp(min=1e-300).log() - q_rest.log()), torch.zeros_like(r))
    return kl + tail, r


def window_summary(kl, same_top1, nll, reference_nll) -> dict[str, float]:
    """Every figure of a job's scoring against its reference, each with its uncertainty. Inputs are
    per-token arrays over all windows."""
    kl = np.asarray(kl, dtype=np.float64)
    out: dict[str, float] = {}
    out["kl_mean"], out["kl_mean_se"] = stats.mean_se(kl)
    for name, q in (("kl_median", 0.5), ("kl_p90", 0.9), ("kl_p99", 0.99)):
        out[name], out[f"{name}_low"], out[f"{name}_high"] = stats.quantile_ci(kl, q)
    out["kl_max"] = float(kl.max())  # an extreme has no useful interval: it is what it is, over these tokens
    out["top1_agreement"], out["top1_agreement_low"], out["top1_agreement_high"] = stats.proportion_ci(same_top1)
    out["reference_perplexity"], out["reference_perplexity_se"] = stats.perplexity_se(reference_nll)
    out["delta_perplexity"], out["delta_perplexity_se"] = stats.delta_perplexity(nll, reference_nll)
    return out


def generation_divergence(top1: torch.Tensor, reference_tokens: list[int]) -> tuple[int, float]:
    """(first divergent token, share of divergent tokens) of one teacher-forced continuation: top1[j] is the
    model's top token for the continuation's position j."""
    n = len(reference_tokens)
    if n == 0:
        return 0, math.nan
    differ = (top1[:n].cpu() != torch.tensor(reference_tokens)).tolist()
    first = differ.index(True) if any(differ) else n
    return first, sum(differ) / n


def generation_summary(first: list[int], share: list[float]) -> dict[str, float]:
    out: dict[str, float] = {}
    out["first_divergent_token"], out["first_divergent_token_se"] = stats.mean_se(first)
    out["divergent_share"], out["divergent_share_se"] = stats.mean_se(share)
    out["identical_continuations"] = float(np.mean([s == 0 for s in share]))
    return out
