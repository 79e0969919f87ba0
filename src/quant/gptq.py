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

import numpy as np
import torch
from scipy.linalg import blas, lapack

from src.quant import bf16math, qparams

DAMP = 0.01  # H's diagonal is raised by this share of its mean: a feature the calibration barely saw stays solvable
INNER = 16  # features whose errors go to each other at once, before the rest of their block (_round_rows)


def gram(x: torch.Tensor) -> torch.Tensor:
    """X^T X of rows [tokens, features], in float32 (as GPTQ's reference: the inputs are bf16 or float32 values,
    their products exact in float32; a 7B layer's in float64 had taken 3x as long). Its lower triangle only, the
    rest zero, in C order: GPTQ reads only that triangle (_reversed_damped). Rows of bf16 values on a CPU that
    multiplies bf16 natively go to bf16 GEMMs summed in float32 (src.quant.bf16math: nothing rounded), a panel of
    rows at a time below the diagonal; others to BLAS's syrk, which forms one triangle (half a GEMM's work)."""
    if x.dtype == torch.bfloat16 and bf16math.native():
        return _lower_by_panels(x.float())
    x = x.float()
    # x's rows in C order are its transpose's columns in BLAS's (Fortran) order: A A^T of that [features, tokens]
    # matrix is X^T X, read in place; its Fortran upper triangle, read in C order, is the lower one
    return torch.from_numpy(blas.ssyrk(1.0, x.numpy().T, trans=0, lower=0)).T


PANEL = 1024  # features per panel of _lower_by_panels: an 11008-wide Gram in 11 GEMMs, 55% of a whole one's work


def _lower_by_panels(x: torch.Tensor) -> torch.Tensor:
    """gram's lower triangle by panels of PANEL features: each panel's rows against the features up to its own
    last, in bf16 operands (the values are bf16 already) summed in float32; the rest of each panel's rows, and the
    diagonal blocks' upper parts, zeroed (each element written once: a zeroed matrix had been written over)."""
    k = x.shape[1]
    out = torch.empty(k, k)
    with bf16math.operands():
        for r0 in range(0, k, PANEL):
            r1 = min(r0 + PANEL, k)
            out[r0:r1, :r1] = x[:, r0:r1].T @ x[:, :r1]
            out[r0:r1, r1:].zero_()
            block = out[r0:r1, r0:r1]
            block.copy_(block.tril())
    return out


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
    if clip is not None:  # each group's weights into [-clip, clip], in place
        c = clip[..., None]
        w.view(n, k // group, group).clamp_(min=-c, max=c)
    v = _factor(h, w)
    block = group or 128
    q = torch.empty(n, k, dtype=torch.int8 if group is None else torch.uint8)
    if group is None:
        scale = w.abs().amax(dim=1).clamp(min=qparams.EPS) / qparams.INT8_MAX
        zero = None
    else:
        scale = torch.empty(n, k // group)
        zero = torch.empty(n, k // group)
    _round_rows(w, v, bits, group, block, q, scale, zero)
    return q, scale, zero


_last: list = []  # [h, its factor, its dead features]: the Gram linears reading one input share (q, k, v)


def _factor(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """_unit_factor of `h`, reused while the same Gram tensor comes again (the linears that read one input share
    it: src.quant.stream): the factor of an 11008-wide Gram takes seconds. `w`'s dead features are zeroed
    each time, as _unit_factor does."""
    if _last and _last[0] is h:
        v, dead = _last[1], _last[2]
        w[:, dead] = 0.0
        return v
    dead = torch.diag(h) == 0
    v = _unit_factor(h, w)
    _last[:] = [h, v, dead]
    return v


def forget() -> None:
    """Drop the factor kept for reuse (a layer's rounding is done)."""
    _last.clear()


def _unit_factor(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """W' (float32, [K, K], C order): the transpose of the upper triangular V with H = V V^T (H damped), each row
    divided by its diagonal, so unit lower triangular; only its lower triangle is meaningful. A feature never seen
    (zero diagonal) is zeroed in `w`, as it meets no input.

    GPTQ's reference factors H^-1 = U^T U (U upper) and sends feature i's error (w_i - q_i) / U_ii on to each later
    feature j weighted by U_ij. The same rounding follows from V = U^-1 with no inverse formed: the weights' total
    change is W - Q = U^T E, so E = V^T (W - Q), and feature j's updated weight is w_j + sum_{i<j} W'_ji (w_i - q_i),
    with the original weights' errors (_round_rows). V is one Cholesky factor: with P the reversal of the features,
    P H P = U^T U gives V = (P U P)^T. So one factorization, where the reference's Cholesky, inverse and Cholesky of
    that are three (a triangular inverse of an 11008-wide factor had taken ~4 s of a 7B layer's ~60). In float32,
    as GPTQ's reference; a Hessian float32 cannot factor is factored in float64."""
    dead = torch.diag(h) == 0
    w[:, dead] = 0.0
    for dtype in (torch.float32, torch.float64):
        upper = _cholesky(_reversed_damped(h, dead, dtype))
        if upper is not None:
            break
    else:
        raise RuntimeError("GPTQ: the calibration inputs' Gram matrix is not positive definite even in float64, damped")
    unit = _reversed(upper).float()  # P U P = V^T
    unit.div_(unit.diagonal().clone()[:, None])
    return unit


def _reversed_damped(h: torch.Tensor, dead: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """P H P in `dtype`, a copy in C order (h, shared by the linears reading one input, is left as is), with a
    never-seen feature's diagonal set to 1 and the diagonal raised by DAMP of its mean. Of h only the lower triangle
    is read (gram's): reversed, it is P H P's upper one, the triangle _cholesky reads."""
    f = _reversed(h).to(dtype)
    diag = f.diagonal()
    diag[dead.flip(0)] = 1.0
    diag.add_(DAMP * diag.mean())
    return f


def _reversed(m: torch.Tensor) -> torch.Tensor:
    """P M P for square `m`, C order: its elements in reverse order, copied by numpy (an 11008-wide matrix in ~0.2 s,
    where torch's flip took 0.33 s of both axes, 0.75 s of the flat view)."""
    flat = m.contiguous().numpy().reshape(-1)
    return torch.from_numpy(np.ascontiguousarray(flat[::-1]).reshape(m.shape))


def _cholesky(f: torch.Tensor) -> torch.Tensor | None:
    """The upper Cholesky factor U of symmetric `f` (U^T U = f), written over `f` (LAPACK's potrf on its memory: no
    copy of an 11008-wide matrix), or None where `f` is not positive definite at its precision (`f` is then spent).
    Only `f`'s upper triangle is read; below the diagonal, `f`'s own values are left."""
    potrf = lapack.spotrf if f.dtype == torch.float32 else lapack.dpotrf
    # f's rows in C order are its columns in LAPACK's (Fortran) order: LAPACK's lower triangle there is f's upper
    # one, and the lower factor L it writes, read back in C order, is L^T = U
    factor, info = potrf(f.numpy().T, lower=1, clean=0, overwrite_a=1)
    return torch.from_numpy(factor.T) if info == 0 else None


def _round_rows(w, unit, bits, group, block, q_out, scale, zero) -> None:
    """GPTQ over rows `w` [n, K] with the unit lower factor `unit` (_unit_factor), writing q_out and, grouped, each group's
    scale and zero.

    The weights are held transposed ([K, n]: one feature's weights contiguous), beside their original values (each
    feature's error is its original weight less its rounded one; a group's range is its weights as the reference
    holds them: _as_updated), and the error feedback is batched at two levels:
    each rounded feature's error goes at once only to the rest of its INNER features, then an inner run's errors to
    the rest of its block, then a block's to every feature after it (one GEMM each), which is GPTQ's lazy batching,
    with each update's footprint small enough to stay in cache."""
    n, k = w.shape
    top = qparams.INT8_MAX if group is None else (1 << bits) - 1
    w0t = w.T.contiguous()
    wt = w0t.clone()
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
            span = _as_updated(wt[b0:b1], w0t[b0:b1], unit[b0:b1, b0:b1])
            lo, hi = span.amin(dim=0), span.amax(dim=0)
            scale_t[g] = ((hi - lo) / top).clamp(min=1e-6)
            zero_t[g] = lo + (1 << (bits - 1)) * scale_t[g]
            step, low = scale_t[g], zero_t[g] - (1 << (bits - 1)) * scale_t[g]
        for c0 in range(b0, b1, INNER):
            c1 = min(c0 + INNER, b1)
            if native is not None:
                native(wt, w0t, unit, qt, err, step if group is None else low, step, c0, c1, b0, top, group is not None)
            else:
                _features(wt, w0t, unit, qt, err, low if group is not None else None, step, c0, c1, b0, top)
            if c1 < b1:  # in place: the GEMM adds as it sums (beta 1), no product held apart
                wt[c1:b1].addmm_(unit[c1:b1, c0:c1], err[c0 - b0 : c1 - b0])
        if b1 < k:
            wt[b1:].addmm_(unit[b1:, b0:b1], err)
    q_out.copy_(qt.T)
    if group is not None:
        scale.copy_(scale_t.T)
        zero.copy_(zero_t.T)


def _as_updated(sums: torch.Tensor, original: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """A group's weights as GPTQ's reference holds them when the group is reached (each earlier feature's error sent
    on to it, and to the features after the group, as the best change of the rest given what is rounded), from the
    one-factor form's sums there (`sums`: each weight plus the W'-weighted errors of the features before the group).
    Only once the group's own earlier features are in do the two forms agree feature by feature; its range is taken
    before, so it takes the reference's values: with H = V V^T, the rest's best change is V22^-T V12^T D, and its
    first `group` entries need only the group's own block of the unit lower factor (_unit_factor: one small solve)."""
    return original + torch.linalg.solve_triangular(unit, sums - original, upper=False, unitriangular=True)


def _native():
    """quantspec's kernel binding's run of features, where the binding is loaded in this process (a job that runs
    quantspec's kernels loads it before it quantizes), else None: the same arithmetic in torch (_features)."""
    try:
        return torch.ops.quantspec.gptq_features
    except (AttributeError, RuntimeError):
        return None


def _features(wt, w0t, unit, qt, err, low, step, c0, c1, b0, top) -> None:
    """Features [c0, c1) of wt [K, n] rounded one at a time (grouped where `low`, each row's grid low + q * step),
    each one's error (its original weight in w0t less its rounded one) sent to the rest of the run, weighted by
    the unit lower factor, and kept in err: the binding's gptq_features, in torch."""
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
            e = w0t[col] - back
            wt[col + 1 : c1] += unit[col + 1 : c1, col, None] * e[None, :]
            err[col - b0] = e
    finally:
        torch.set_num_threads(threads)
