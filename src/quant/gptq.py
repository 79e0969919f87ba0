"""GPTQ's rounding (Frantar et al., 2022): a linear's weights rounded one input feature at a time, each
rounding's error pushed onto the features not yet rounded, weighted by the inverse of the calibration inputs'
Gram matrix H = X^T X. Round to nearest makes each weight's own error small; this makes the layer's output
error small, over the inputs it saw.

The grids are those of src.quant.qparams, so the result is stored and run as any other linear of its scheme:
int8 symmetric per output channel (its scale from the weights before any update), or b-bit asymmetric per
group, each group's range taken from its weights as updated when its first feature is reached (as GPTQ's
reference does).

Rows (output channels) are independent given H, so they run in chunks that stay in cache: Gemma 3's head
(262144 x 640) takes seconds.
"""

from __future__ import annotations

import numpy
import torch
from scipy.linalg import lapack

from src.quant import qparams

DAMP = 0.01  # H's diagonal is raised by this share of its mean: a feature the calibration barely saw stays solvable
ROWS = 8192  # output channels rounded together


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
    for r0 in range(0, n, ROWS):
        rows = slice(r0, min(r0 + ROWS, n))
        _round_rows(
            w[rows].clone(), inv, bits, group, block, q[rows], scale[rows], None if zero is None else zero[rows]
        )
    return q, scale, zero


_last: list = []  # [h, its factor, its dead features]: the Gram linears reading one input share (q, k, v)


def _factor(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """_inverse_factor of `h`, reused while the same Gram tensor comes again (the linears that read one input share
    it: src.quant.sequential): the factor of an 11008-wide Gram takes seconds. `w`'s dead features are zeroed
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
    h += torch.eye(h.shape[0], dtype=h.dtype) * DAMP * torch.diag(h).mean()
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
    inverse, info = trtri(lower.numpy(), lower=1)
    return torch.from_numpy(numpy.ascontiguousarray(inverse)), int(info)


def _round_rows(w, inv, bits, group, block, q_out, scale, zero) -> None:
    """GPTQ over rows `w` [n, K] (updated in place), writing q_out and, grouped, each group's scale and zero."""
    k = w.shape[1]
    top = (1 << bits) - 1
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        part, err = w[:, b0:b1], torch.empty(w.shape[0], b1 - b0)
        inv_b = inv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            x = part[:, i]
            if group is None:
                qi = torch.round(x / scale).clamp_(-qparams.INT8_MAX, qparams.INT8_MAX)
                back = qi * scale
            else:
                g = col // group
                if col % group == 0:  # the group's range from its weights as updated so far
                    lo, hi = part[:, i : i + group].amin(dim=1), part[:, i : i + group].amax(dim=1)
                    scale[:, g] = ((hi - lo) / top).clamp(min=1e-6)
                    zero[:, g] = lo + (1 << (bits - 1)) * scale[:, g]
                lo = zero[:, g] - (1 << (bits - 1)) * scale[:, g]
                qi = torch.round((x - lo) / scale[:, g]).clamp_(0, top)
                back = qi * scale[:, g] + lo
            q_out[:, col] = qi.to(q_out.dtype)
            e = (x - back) / inv_b[i, i]
            part[:, i:] -= e[:, None] * inv_b[i, i:][None, :]
            err[:, i] = e
        w[:, b1:] -= err @ inv[b0:b1, b1:]
