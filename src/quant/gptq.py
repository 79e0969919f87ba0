"""GPTQ's rounding (Frantar et al., 2022): a linear's weights rounded one input feature at a time, each
rounding's error pushed onto the features not yet rounded, weighted by the inverse of the calibration inputs'
Gram matrix H = X^T X. Round to nearest makes each weight's own error small; this makes the layer's output
error small, over the inputs it saw.

The grids are those of src.quant.qparams, so the result is stored and run as any other linear of its scheme:
int8 symmetric per output channel (its scale from the weights before any update), or b-bit asymmetric per
group, each group's range taken from its weights as updated when its first feature is reached (as GPTQ's
reference does).

Rows (output channels) are independent given H: every row of a linear is rounded at once, one feature at a time.
"""

from __future__ import annotations

import torch
from scipy.linalg import lapack

from src.quant import qparams

DAMP = 0.01  # H's diagonal is raised by this share of its mean: a feature the calibration barely saw stays solvable
INNER = 16  # features whose errors go to each other at once, before the rest of their block (_round_rows)


def gram(x: torch.Tensor) -> torch.Tensor:
    """X^T X of rows [tokens, features], in float32 (as GPTQ's reference: the inputs are bf16 or float32 values,
    their products exact in float32; a 7B layer's in float64 had taken 3x as long)."""
    x = x.float()
    return x.T @ x


@torch.no_grad()
def round_weights(
    weight: torch.Tensor, h: torch.Tensor, bits: int, group: int | None, clip: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q, scale, zero) of `weight` [N, K] on its scheme's grid: at 8 bits (group None) int8 q [N, K] and a
    scale per row, zero None; below, uint8 q in 0..2^bits-1 with scale and zero [N, K/group], as
    qparams.int_groups gives. `h` is the [K, K] Gram of the linear's inputs; `clip` ([N, K/group]) bounds
    each group's weights as int_groups does."""
    n, k = weight.shape
    if group is not None:
        qparams.check_group(k, group)
    w = weight.detach().float().clone()  # updated in place: never the model's own tensor
    if clip is not None:
        c = clip.repeat_interleave(group, dim=1)
        w = torch.max(torch.min(w, c), -c)
    inv = _factor(h, w)
    block = group or 128
    q = torch.empty(n, k, dtype=torch.int8 if group is None else torch.uint8)
    if group is None:
        scale = w.abs().amax(dim=1).clamp(min=qparams.EPS) / qparams.INT8_MAX
        zero = None
    else:
        scale = torch.empty(n, k // group)
        zero = torch.empty(n, k // group)
    _round_rows(w, inv, bits, group, block, q, scale, zero)
    return q, scale, zero


_last: list = []  # [h, its factor, its dead features]: the Gram linears reading one input share (q, k, v)


def _factor(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """_inverse_factor of `h`, reused while the same Gram tensor comes again (the linears that read one input share
    it: src.quant.stream): the factor of an 11008-wide Gram takes seconds. `w`'s dead features are zeroed
    each time, as _inverse_factor does."""
    if _last and _last[0] is h:
        inv, dead = _last[1], _last[2]
        w[:, dead] = 0.0
        return inv
    dead = torch.diag(h) == 0
    inv = _inverse_factor(h.clone(), w)
    _last[:] = [h, inv, dead]
    return inv


def forget() -> None:
    """Drop the factor kept for reuse (a layer's rounding is done)."""
    _last.clear()


def _inverse_factor(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The upper Cholesky factor U of H^-1 (U^T U = H^-1, float32), H damped; a feature never seen (zero diagonal)
    is zeroed in `w`, as it meets no input.

    One Cholesky and one triangular inverse, not three factorizations: with P the reversal of the features,
    P H P = L L^T gives H^-1 = (P L^-1 P)^T (P L^-1 P), and P L^-1 P is upper triangular with a positive diagonal,
    so it is U: one factorization and a third of one, where Cholesky, its inverse and a Cholesky of that are three.
    In float32, as GPTQ's reference; a Hessian float32 cannot factor is factored in float64."""
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h.diagonal().add_(DAMP * torch.diag(h).mean())
    for dtype in (torch.float32, torch.float64):
        lower, info = torch.linalg.cholesky_ex(h.to(dtype).flip(0, 1))
        if info.item() == 0:
            inverse, bad = _triangular_inverse(lower)
            if bad == 0:
                return inverse.flip(0, 1).float()
    raise RuntimeError("GPTQ: the calibration inputs' Gram matrix is not positive definite even in float64, damped")


def _triangular_inverse(lower: torch.Tensor) -> tuple[torch.Tensor, int]:
    """L^-1 of a lower triangular L (LAPACK's trtri: a third of a solve against the identity's work), and
    LAPACK's info (0: done)."""
    trtri = lapack.strtri if lower.dtype == torch.float32 else lapack.dtrtri
    # L's rows in C order are L^T's columns in LAPACK's (Fortran) order: inverting that upper factor in place of
    # the lower one, and reading its inverse back transposed, copies nothing (an 11008-wide copy took ~1 s each way)
    inverse, info = trtri(lower.numpy().T, lower=0, overwrite_c=1)
    return torch.from_numpy(inverse.T), int(info)


def _round_rows(w, inv, bits, group, block, q_out, scale, zero) -> None:
    """GPTQ over rows `w` [n, K], writing q_out and, grouped, each group's scale and zero.

    The weights are held transposed ([K, n]: one feature's weights contiguous), and the error feedback is batched at
    two levels: each rounded feature's error goes at once only to the rest of its INNER features, then an inner
    run's errors to the rest of its block, then a block's to every feature after it (one GEMM each), which is GPTQ's
    lazy batching, with each update's footprint small enough to stay in cache."""
    n, k = w.shape
    top = qparams.INT8_MAX if group is None else (1 << bits) - 1
    wt = w.T.contiguous()
    qt = torch.empty(k, n, dtype=q_out.dtype)
    if group is None:
        step = scale  # per row, from the weights before any update
    else:
        scale_t, zero_t = torch.empty(k // group, n), torch.empty(k // group, n)
        assert block == group, "a group is ranged at its block's start"
    native = _native()
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        err = torch.empty(b1 - b0, n)
        if group is not None:  # the group (a block: group == block) ranged by its weights as updated so far
            g = b0 // group
            span = wt[b0 : b0 + group]
            lo, hi = span.amin(dim=0), span.amax(dim=0)
            scale_t[g] = ((hi - lo) / top).clamp(min=1e-6)
            zero_t[g] = lo + (1 << (bits - 1)) * scale_t[g]
            step, low = scale_t[g], zero_t[g] - (1 << (bits - 1)) * scale_t[g]
        for c0 in range(b0, b1, INNER):
            c1 = min(c0 + INNER, b1)
            if native is not None:
                native(wt, inv, qt, err, step if group is None else low, step, c0, c1, b0, top, group is not None)
            else:
                _features(wt, inv, qt, err, low if group is not None else None, step, c0, c1, b0, top)
            if c1 < b1:  # in place: the GEMM subtracts as it sums (beta 1, alpha -1), no product held apart
                wt[c1:b1].addmm_(inv[c0:c1, c1:b1].T, err[c0 - b0 : c1 - b0], alpha=-1)
        if b1 < k:
            wt[b1:].addmm_(inv[b0:b1, b1:].T, err, alpha=-1)
    q_out.copy_(qt.T)
    if group is not None:
        scale.copy_(scale_t.T)
        zero.copy_(zero_t.T)


def _native():
    """quantspec's kernel binding's run of features, where the binding is loaded in this process (a job that runs
    quantspec's kernels loads it before it quantizes), else None: the same arithmetic in torch (_features)."""
    try:
        return torch.ops.quantspec.gptq_features
    except (AttributeError, RuntimeError):
        return None


def _features(wt, inv, qt, err, low, step, c0, c1, b0, top) -> None:
    """Features [c0, c1) of wt [K, n] rounded one at a time (grouped where `low`, each row's grid low + q * step),
    each one's error sent to the rest of the run and kept in err: the binding's gptq_features, in torch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a feature's few-thousand-wide ops: waiting on a second thread costs more
    try:
        for col in range(c0, c1):
            x = wt[col]
            if low is None:
                qi = torch.round(x / step).clamp_(-top, top)
                back = qi * step
            else:
                qi = torch.round((x - low) / step).clamp_(0, top)
                back = qi * step + low
            qt[col] = qi.to(qt.dtype)
            e = (x - back) / inv[col, col]
            wt[col + 1 : c1] -= inv[col, col + 1 : c1, None] * e[None, :]
            err[col - b0] = e
    finally:
        torch.set_num_threads(threads)
