"""AWQ (Lin et al., 2024): activation-aware scales, then an optional clipping search, for grouped low-bit weights (4-bit, 2-bit, ...).

For each group of linears sharing one input x: s = mean|x|^r over a grid of r in [0, 1), normalized;
the loss is the MSE of the group's outputs (x @ Q(W * s)^T / s vs x @ W^T) on calibration tokens.
r = 0 is plain round-to-nearest, so the chosen scales never do worse than RTN on that data. The
clipping search then shrinks each group's weight range where that lowers the output error.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from src.kernels.loader import binding_op
from src.quant import bf16math, scaling
from src.quant.arch import ScaleGroup
from src.quant.qparams import fake_int8_act
from src.quant.stream import Scaled, Seen

log = logging.getLogger(__name__)


def search_scale(
    x: torch.Tensor,
    linears: list[nn.Linear],
    group: int,
    grid: int,
    block: nn.Module | None = None,
    rows: int | None = None,
    seed: int = 0,
    act_int8: bool = False,
    bits: int = 4,
) -> tuple[torch.Tensor, float]:
    """The best s for one group of linears sharing input x, and its exponent r.

    The loss is the MSE of `block(x)` when a block is given (the MLP: errors seen through its
    nonlinearity and output projection), else of the linears' concatenated outputs. On gemma3-270m
    the linears' outputs chose better scales (perplexity 5.39 against 5.54), so that is the default.
    (AutoAWQ's duo scaling, mean|x|^r / mean|w|^(1-r), measured worse still: 5.91.)

    `rows`: the output loss is a mean over output channels, and s scales input channels only, so a
    fixed random sample of `rows` output channels estimates it without bias (4-bit groups run along
    the input features: a sampled row is quantized exactly as in the whole). At 7B this makes the search
    ~40x cheaper (Llama-2-7B's gate+up group has 22016 rows).

    `act_int8` (w4a8): the linears' outputs are scored as the kernel computes them, x / s rounded per token to
    int8 against Q(W * s): s moves activation outliers into the weights, which helps the int8 activations as
    SmoothQuant's scales do, and the search weighs that against the 4-bit weights' error.
    """
    if block is None:
        w = torch.cat([lin.weight.detach() for lin in linears])
        if rows is not None and w.shape[0] > rows:
            keep = torch.randperm(w.shape[0], generator=torch.Generator().manual_seed(seed))[:rows].sort().values
            w = w[keep]
        w = w.float()
        if act_int8:
            ref = x @ w.T
            error = lambda s: fake_int8_act(x / s) @ _fake_groups(w * s, group, bits).T - ref  # noqa: E731
        else:
            # the outputs' change x (Q(W s) / s - W)^T in one GEMM per trial, where the CPU multiplies bf16 natively
            # in bf16 operands and result: x's values are bf16 already, the change's relative rounding (2^-9) is of
            # the change itself, not of the weights, so the loss is finer than trial outputs less the reference
            # (each rounded at the weights' scale), and ~2.5x as fast as the fp32 GEMM (an AVX512-BF16 EPYC: ~390
            # GF/s against ~160, at 2048 tokens x 4096 x 512 rows)
            operand = torch.bfloat16 if bf16math.native() else torch.float32
            xo = x.to(operand)
            error = lambda s: xo @ (_fake_groups(w * s, group, bits).div_(s).sub_(w)).to(operand).T  # noqa: E731
    else:
        originals = [lin.weight.detach().clone() for lin in linears]
        ref = block(x)

        def error(s):
            for lin, orig in zip(linears, originals):
                lin.weight.copy_(_fake_groups(orig.float() * s, group, bits).div_(s))
            try:
                return block(x) - ref
            finally:
                for lin, orig in zip(linears, originals):
                    lin.weight.copy_(orig)

    x_mean = x.abs().mean(dim=0)
    best_loss, best_s, best_r = float("inf"), torch.ones_like(x_mean), 0.0
    for i in range(grid):
        r = i / grid
        s = x_mean.pow(r).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        with bf16math.operands():  # the trials ranked by GEMMs as fine as AWQ's own fp16 ones (src.quant.bf16math)
            loss = error(s).float().pow_(2).mean().item()
        if loss < best_loss:
            best_loss, best_s, best_r = loss, s, r
    return best_s, best_r


def search_clip(
    x: torch.Tensor,
    w: torch.Tensor,
    group: int,
    grid: int = 20,
    min_ratio: float = 0.5,
    rows: int = 128,
    bits: int = 4,
) -> torch.Tensor:
    """Per (output channel, group) max |w| that minimizes the group's output error: [N, K/group].

    A group's output error over the tokens x is mean_t (x_t . d)^2 for its weights' change d = Q(w) - w, which is
    d^T (X^T X / T) d with X that group's [T, group] columns: so each group's 128 x 128 Gram is formed once and
    every trial clip costs N x K x group multiply-adds, whatever the tokens (where the outputs x @ Q(w)^T, formed per
    trial, had cost N x K x T: at 512 tokens, 4x as much, ~24 s for one 7B layer).

    `rows` output channels at a time: each trial's temporaries (rows x K float32) stay small enough (2 MB) for
    glibc to reuse freed blocks; 2048 rows (32 MB) went to fresh mmapped pages each time, and one 7B gate_proj's
    search took 7.1 s (6.9 s of it the kernel faulting pages in) where 128 rows take 1.6 s, the same clips."""
    n, k = w.shape
    xg = x.float().reshape(-1, k // group, group).transpose(0, 1)  # [G, T, g]
    grams = torch.bmm(xg.transpose(1, 2), xg) / xg.shape[1]  # [G, g, g]
    # each trial's d G in bf16 operands where the CPU multiplies bf16 natively: the losses rank ~11 trial clips, and
    # d's and G's own rounding (2^-9, relative) is far finer than the trials' spacing; AWQ's reference scores them in
    # fp16. Two thirds of the search had been this fp32 bmm; in bf16 it takes half as long (an AVX512-BF16 EPYC)
    operand = torch.bfloat16 if bf16math.native() else torch.float32
    grams = grams.to(operand)
    # each trial's change and its error in one pass each where the binding is loaded (the same change, bit for bit;
    # the error summed in another order), where torch's elementwise ops had been a third of the search
    change, dots = binding_op("clip_change"), binding_op("row_dots_bf16")
    fused = operand == torch.bfloat16 and change is not None and dots is not None
    best_clip = []
    for lo in range(0, n, rows):
        # [G, r, g]: each group's rows together, as the batched GEMM reads them (a transposed view had been copied
        # for it at every trial)
        wg = w[lo : lo + rows].float().reshape(-1, k // group, group).transpose(0, 1).contiguous()
        low, high = torch.aminmax(wg, dim=-1)  # [G, r]
        w_max = torch.maximum(-low, high)
        best_err = torch.full_like(w_max, float("inf"))
        best = w_max.clone()
        for i in range(int(grid * (1 - min_ratio)) + 1):
            clip = w_max * (1 - i / grid)
            if fused:
                d = change(wg, clip, low, high, bits)  # [G, r, g], bf16
                err = dots(torch.bmm(d, grams), d)  # [G, r]
            else:
                d = _clipped_change(wg, clip, bits, low, high).to(operand)
                err = torch.bmm(d, grams).float().mul_(d.float()).sum(dim=-1)
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best = torch.where(better, clip, best)
        best_clip.append(best.T)
    return torch.cat(best_clip)


def _clipped_change(wg: torch.Tensor, clip: torch.Tensor, bits: int, low: torch.Tensor, high: torch.Tensor):
    """Q(w) - w for groups wg [..., g] clipped to [-clip, clip] (clip: wg's shape less its last axis) on
    qparams.int_groups' grid, in as few passes as that takes, in place on one copy (the search makes 11 of these per
    linear: qparams' general path had made ~14 passes). `low`, `high`: each group's own min and max, so the clipped
    group's are known without a pass (clipping is monotone: max(low, -clip), min(high, clip))."""
    c = clip[..., None]
    lo, hi = torch.maximum(low, -clip)[..., None], torch.minimum(high, clip)[..., None]
    return _rounded_(wg.clamp(min=-c, max=c), bits, lo, hi).sub_(wg)


def _rounded_(g: torch.Tensor, bits: int, lo: torch.Tensor | None = None, hi: torch.Tensor | None = None):
    """Groups g [..., group] rounded in place to their min/max range's grid of 2^bits levels (qparams.int_groups'
    grid, the value lo + q * scale; lo and hi [..., 1] where known): the searches' trial weights, in five passes and
    no copies."""
    top = (1 << bits) - 1
    if lo is None:
        lo, hi = torch.aminmax(g, dim=-1, keepdim=True)
    scale = ((hi - lo) / top).clamp_(min=1e-6)
    return g.sub_(lo).div_(scale).round_().clamp_(0, top).mul_(scale).add_(lo)


def _fake_groups(w: torch.Tensor, group: int, bits: int) -> torch.Tensor:
    """w [N, K] (a copy) rounded per group of `group` input features: the scale search's trial weights."""
    n, k = w.shape
    return _rounded_(w.reshape(n, k // group, group), bits).reshape(n, k)


@torch.no_grad()
def awq_layer(
    groups: list[ScaleGroup],
    linears: dict[str, nn.Module],
    seen: Seen,
    index: int,
    group: int,
    grid: int,
    clip: bool,
    block_loss: bool = False,
    clip_only: set[str] | None = None,
    search_rows: int | None = None,
    act_int8: bool = False,
    bits: int = 4,
) -> Scaled:
    """Scale one layer in place (its `groups`, by the sampled input rows its forward met: src.quant.stream), then
    search the clip ranges of its `linears`. `act_int8`: the scale search scores int8 activations too (search_scale;
    not with block_loss); `bits`: the weights'. `index` (the layer's) seeds each group's sample of output rows."""
    scaled = Scaled()
    inputs: dict[str, torch.Tensor] = {}  # by leader: what the linears reading it meet once scaled
    for j, g in enumerate(groups):
        kept = seen.of(seen.rows, g.names[0])
        x = kept.float()
        block = g.block if block_loss else None
        seed = index * len(groups) + j
        s, r = search_scale(
            x, g.linears, group, grid, block, search_rows, seed=seed, act_int8=act_int8 and block is None, bits=bits
        )
        scaled.changed.update(scaling.apply(g, s))
        scaled.divided.update({name: s for name in g.names})
        if clip:  # what the scaled linears now see, for their clipping search
            inputs[seen.leader[g.names[0]]] = (x / s).to(kept.dtype)
        log.debug("awq %s: r=%.2f", g.prev_name, r)
    if clip:
        for name, lin in linears.items():
            # AWQ leaves q and k unclipped: attention scores are too sensitive to their range.
            if name.endswith(("q_proj", "k_proj")) or (clip_only is not None and name not in clip_only):
                continue
            x = inputs.get(seen.leader[name], seen.of(seen.rows, name))  # unscaled where no group scales it
            scaled.clips[name] = search_clip(x[:512].float(), lin.weight, group, bits=bits)
    return scaled
