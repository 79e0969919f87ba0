"""GPTQ's rounding (Frantar et al., 2022): a linear's weights rounded one input feature at a time, each
rounding's error pushed onto the features not yet rounded, weighted by the inverse of the calibration inputs'
Gram matrix H = X^T X. Round to nearest makes each weight's own error small; this makes the layer's output
error small, over the inputs it saw.

The grids are those of src.quant.qparams, so the result is stored and run as any other linear of its format:
int8 symmetric per output channel (its scale from the weights before any update), or b-bit asymmetric per
group, each group's range taken from its weights as updated when its first feature is reached (as GPTQ's
reference does).

Rows (output channels) are independent given H: every row of a linear is rounded at once, one feature at a time.

The features are rounded first to last, as GPTQ's reference rounds them, but held in reverse order throughout: the
Grams are formed of the inputs' features reversed (`gram`: P H P, P the reversal), the weights reversed as they are
transposed, the result put back in order at the end. Reversed, first to last is last to first, which H's own
Cholesky factor rounds with no inverse formed (_unit_factor), so no K x K matrix is ever copied in reverse (the
inputs and weights are, in copies made anyway), and the reference's order is kept. (Rounded last to first in the
features' own order, the default model's w4a16 measured within the spread float roundings alone give it: its KL
against fp32 was 0.129 and 0.154 for two builds of this order that differ only in the order of a Gram's sums,
0.151-0.158 for that one: GPTQ sends each rounding on, so a weight near a half-step moves the rest.)
"""

from __future__ import annotations

import torch
from scipy.linalg import blas, lapack

from src.kernels.loader import binding_op
from src.quant import bf16gemm, bf16math, qparams

DAMP = 0.01  # H's diagonal is raised by this share of its mean: a feature the calibration barely saw stays solvable
INNER = 16  # features whose errors go to each other at once, before the rest of their block (_round_rows)
SUPER = 512  # features whose errors go to every feature before them in one GEMM (_round_rows)


def gram(x: torch.Tensor) -> torch.Tensor:
    """X^T X of rows [tokens, features] in GPTQ's order, the features reversed (P X^T X P: the module's docstring
    says why), in float32 (as GPTQ's reference: the inputs are bf16 or float32 values, their products exact in
    float32; a 7B layer's in float64 had taken 3x as long). Its upper triangle only, the rest zero, in C order: GPTQ
    reads only that triangle (_damped). Rows of bf16 values go to bf16 GEMMs summed
    in float32 (nothing rounded) where the CPU multiplies bf16 natively: on AMX's tiles, oneDNN's bf16 math mode
    (src.quant.bf16math), a panel of rows at a time above the diagonal; elsewhere quantspec's own kernel
    (src.quant.bf16gemm) where it is loaded. Others go to BLAS's syrk, which forms one triangle (half a GEMM's
    work)."""
    x = x.flip(1)  # a copy of the rows (each path below copies them once more, as its GEMM reads them)
    if x.dtype == torch.bfloat16 and torch.cpu._is_amx_tile_supported():
        return _upper_by_panels(x.float())
    if x.dtype == torch.bfloat16 and bf16gemm.native():
        return bf16gemm.gram_upper(x)
    x = x.float()
    # x's rows in C order are its transpose's columns in BLAS's (Fortran) order: A A^T of that [features, tokens]
    # matrix is X^T X, read in place; its Fortran lower triangle, read in C order, is the upper one
    return torch.from_numpy(blas.ssyrk(1.0, x.numpy().T, trans=0, lower=1)).T


PANEL = 1024  # features per panel of _upper_by_panels: an 11008-wide Gram in 11 GEMMs, 55% of a whole one's work


def _upper_by_panels(x: torch.Tensor) -> torch.Tensor:
    """gram's upper triangle by panels of PANEL features: each panel's rows against the features from its own
    first, in bf16 operands (the values are bf16 already) summed in float32; the rest of each panel's rows, and the
    diagonal blocks' lower parts, zeroed (each element written once: a zeroed matrix had been written over)."""
    k = x.shape[1]
    out = torch.empty(k, k)
    with bf16math.operands():
        for r0 in range(0, k, PANEL):
            r1 = min(r0 + PANEL, k)
            out[r0:r1, r0:] = x[:, r0:r1].T @ x[:, r0:]
            out[r0:r1, :r0].zero_()
            block = out[r0:r1, r0:r1]
            block.copy_(block.triu())
    return out


def scaled_(h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """`h` (gram's) divided in place by s s^T: the Gram of the inputs divided by s per feature (AWQ's and
    SmoothQuant's scaling), by rows then by columns, no s s^T formed."""
    s = s.float().flip(0)  # in gram's order
    return h.div_(s[:, None]).div_(s[None, :])


@torch.no_grad()
def round_weights(
    weight: torch.Tensor, h: torch.Tensor, bits: int, group: int | None, clip: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q, scale, zero) of `weight` [N, K] on its format's grid: at 8 bits (group None) int8 q [N, K] and a
    scale per row, zero None; below, uint8 q in 0..2^bits-1 with scale and zero [N, K/group], as
    qparams.int_groups gives. `h` is the [K, K] Gram of the linear's inputs (gram's, in its order); `clip`
    ([N, K/group]) bounds each group's weights as int_groups does."""
    n, k = weight.shape
    if group is not None:
        qparams.check_group(k, group)
    # held transposed ([K, n]: one feature's weights contiguous) in gram's order, a float32 copy made in one
    # transposing pass (never the model's own tensor), updated in place
    w0t = _flipped_transpose(weight.detach())
    if clip is not None:  # each group's weights into [-clip, clip], in place
        c = clip.flip(1).T[:, None, :]  # [K/group, 1, n]
        w0t.view(k // group, group, n).clamp_(min=-c, max=c)
    v = _factor(h, w0t)
    block = group or 128
    qt = torch.empty(k, n, dtype=torch.int8 if group is None else torch.uint8)
    if group is None:
        scale = w0t.abs().amax(dim=0).clamp(min=qparams.EPS) / qparams.INT8_MAX
        zero = None
    else:
        scale = torch.empty(k // group, n)
        zero = torch.empty(k // group, n)
    _round_rows(w0t, v, bits, group, block, qt, scale, zero)
    # back in the features' own order and [n, K] (a grouped format's groups reversed with them: K is whole groups)
    if group is None:
        return qt.flip(0).T.contiguous(), scale, None
    return tuple(t.flip(0).T.contiguous() for t in (qt, scale, zero))


def _flipped_transpose(t: torch.Tensor) -> torch.Tensor:
    """t [R, C] with its columns reversed, transposed: a contiguous float32 [C, R], in one tiled pass by the binding
    where it is loaded (an 11008 x 4096 linear's two copies, torch's flip and its strided transposing copy, had
    taken ~0.2 s of the two's ~0.3), else by torch."""
    op = binding_op("flipped_transpose")
    if op is not None:
        return op(t.contiguous())
    return t.flip(1).T.to(torch.float32, memory_format=torch.contiguous_format, copy=True)


_last: list = []  # [h, its factor, its dead features]: the Gram linears reading one input share (q, k, v)


def _factor(h: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """_unit_factor of `h`, reused while the same Gram tensor comes again (the linears that read one input share
    it: src.quant.stream): the factor of an 11008-wide Gram takes seconds. The dead features of `wt` (weights
    transposed, [K, n]) are zeroed each time, as _unit_factor does."""
    if _last and _last[0] is h:
        v, dead = _last[1], _last[2]
        wt[dead] = 0.0
        return v
    dead = torch.diag(h) == 0
    v = _unit_factor(h, wt)
    _last[:] = [h, v, dead]
    return v


def forget() -> None:
    """Drop the factor kept for reuse (a layer's rounding is done)."""
    _last.clear()


def _unit_factor(h: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """W' (float32, [K, K], C order): the transpose of H's lower Cholesky factor L (H = L L^T, H damped), each row
    divided by its diagonal, so unit upper triangular; only its upper triangle is meaningful (row j holds what each
    later feature's error sends to feature j, contiguous, as GPTQ's block updates read it). A feature never seen
    (zero diagonal) is zeroed in `wt` (the weights transposed, [K, n]), as it meets no input.

    GPTQ's reference rounds the features first to last, factoring H^-1 = U^T U (U upper) and sending feature i's
    error (w_i - q_i) / U_ii on to each later feature j weighted by U_ij. Here, in gram's order (the features
    reversed: the module's docstring), they are rounded last to first, where the same rounding follows from H's own
    Cholesky factor with no inverse formed: H^-1 = M^T M (M lower) gives L = M^-1, the weights' total change W - Q = M^T E,
    so E = L^T (W - Q), and feature j's updated weight is w_j + sum_{i>j} W'_ji (w_i - q_i), with the original
    weights' errors (_round_rows). So one factorization of H as it is, where the reference's Cholesky, inverse and
    Cholesky of that are three (a triangular inverse of an 11008-wide factor had taken ~4 s of a 7B layer's ~60),
    and first to last on H in the features' own order it had needed H reversed before the factorization and the
    factor after it (two copies of the matrix in reverse order: 4.8 s of two 7B layers' 92). In float32, as GPTQ's
    reference; a Hessian float32 cannot factor is factored in float64."""
    dead = torch.diag(h) == 0
    wt[dead] = 0.0
    for dtype in (torch.float32, torch.float64):
        upper = _cholesky(_damped(h, dead, dtype))
        if upper is not None:
            break
    else:
        raise RuntimeError("GPTQ: the calibration inputs' Gram matrix is not positive definite even in float64, damped")
    unit = upper.float()
    unit.div_(unit.diagonal().clone()[:, None])
    return unit


def _damped(h: torch.Tensor, dead: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """H in `dtype`, a copy in C order (h, shared by the linears reading one input, is left as is), with a never-seen
    feature's diagonal set to 1 and the diagonal raised by DAMP of its mean. Of h only the upper triangle is read
    (gram's), the triangle _cholesky reads."""
    f = h.to(dtype, memory_format=torch.contiguous_format, copy=True)
    diag = f.diagonal()
    diag[dead] = 1.0
    diag.add_(DAMP * diag.mean())
    return f


def _cholesky(f: torch.Tensor) -> torch.Tensor | None:
    """L^T, the transpose of the lower Cholesky factor L of symmetric `f` (L L^T = f), written over `f` (LAPACK's
    potrf on its memory: no copy of an 11008-wide matrix), or None where `f` is not positive definite at its
    precision (`f` is then spent). Only `f`'s upper triangle is read; below the diagonal, `f`'s own values are left."""
    potrf = lapack.spotrf if f.dtype == torch.float32 else lapack.dpotrf
    # f's rows in C order are its columns in LAPACK's (Fortran) order: LAPACK's lower triangle there is f's upper
    # one, and the lower factor L it writes, read back in C order, is L^T
    factor, info = potrf(f.numpy().T, lower=1, clean=0, overwrite_a=1)
    return torch.from_numpy(factor.T) if info == 0 else None


def _round_rows(w0t, unit, bits, group, block, qt, scale, zero) -> None:
    """GPTQ over the weights transposed `w0t` [K, n] (one feature's weights contiguous) with the unit upper factor
    `unit` (_unit_factor), the features last to first (in gram's order: the features' own first to last), writing
    qt [K, n] and each group's scale and zero [K/group, n] (at 8 bits `scale` is given: per row, from the weights
    before any update), all in gram's order.

    The weights are updated in a copy beside their original values (each feature's error is its original weight
    less its rounded one; a group's range is its weights as the reference holds them: _as_updated), and the error
    feedback is batched at three levels, GPTQ's lazy batching: each rounded feature's error goes at once only to the
    rest of its INNER features, an inner run's errors to the rest of its block, a block's to the rest of its run of
    SUPER features, and that run's to every feature before it, one GEMM each. The last GEMMs hold most of GPTQ's
    multiply-adds; summed over SUPER features, each reads and writes the features it updates a quarter as often as
    over a block's 128 (quantspec's bf16 GEMM: 1.7x the rate, on an AVX512-BF16 EPYC)."""
    k, n = w0t.shape
    top = qparams.INT8_MAX if group is None else (1 << bits) - 1
    if group is not None:
        assert block == group, "a group is ranged at its block's start"
    run = max(SUPER // block, 1) * block  # whole blocks: a group never spans two runs
    wt = w0t.clone()
    native = binding_op("gptq_features")  # else the same arithmetic in torch (_features)
    # the GEMMs in bf16 operands where quantspec's kernel has them (src.quant.bf16gemm: 1.3-1.9x fp32's rate on an
    # AVX512-BF16 EPYC), each block's errors packed for it once (for its block's update and, joined, its run's),
    # else in fp32
    packs = bf16gemm.native()
    step = low = scale
    for s1 in range(k, 0, -run):
        s0 = max(s1 - run, 0)
        err = torch.empty(s1 - s0, n)  # the run's errors, by feature from s0
        packed: list[torch.Tensor] = []  # its blocks' errors as the bf16 GEMM reads them, the last block first
        for b1 in range(s1, s0, -block):
            b0 = max(b1 - block, s0)
            if group is not None:  # the group (a block) ranged by its weights as updated so far
                g = b0 // group
                span = _as_updated(wt[b0:b1], w0t[b0:b1], unit[b0:b1, b0:b1])
                lo, hi = span.amin(dim=0), span.amax(dim=0)
                scale[g] = ((hi - lo) / top).clamp(min=1e-6)
                zero[g] = lo + (1 << (bits - 1)) * scale[g]
                step, low = scale[g], zero[g] - (1 << (bits - 1)) * scale[g]
            for c1 in range(b1, b0, -INNER):
                c0 = max(c1 - INNER, b0)
                if native is not None:
                    native(wt, w0t, unit, qt, err, low, step, c0, c1, s0, top, group is not None)
                else:
                    _features(wt, w0t, unit, qt, err, low if group is not None else None, step, c0, c1, s0, top)
                if c0 > b0:  # in place: the GEMM adds as it sums (beta 1), no product held apart
                    wt[b0:c0].addmm_(unit[b0:c0, c0:c1], err[c0 - s0 : c1 - s0])
            errors = err[b0 - s0 : b1 - s0]
            if packs and (b0 > s0 or s0 > 0):  # (only the lowest block, never joined, can have an odd count)
                packed.append(bf16gemm.panels(errors))
            if b0 > s0:
                if packs:
                    bf16gemm.addmm_panels_(wt[s0:b0], unit[s0:b0, b0:b1], packed[-1])
                else:
                    wt[s0:b0].addmm_(unit[s0:b0, b0:b1], errors)
        if s0 > 0:
            if packs:
                bf16gemm.addmm_panels_(wt[:s0], unit[:s0, s0:s1], bf16gemm.joined(packed[::-1]))
            else:
                wt[:s0].addmm_(unit[:s0, s0:s1], err)


def _as_updated(sums: torch.Tensor, original: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """A group's weights as GPTQ's reference holds them when the group is reached (each later feature's error sent
    on to it, and to the features before the group, as the best change of the rest given what is rounded), from the
    one-factor form's sums there (`sums`: each weight plus the W'-weighted errors of the features after the group).
    Only once the group's own later features are in do the two forms agree feature by feature; its range is taken
    before, so it takes the reference's values: with H = L L^T, the rest's best change is L11^-T L21^T D, and its
    last `group` entries need only the group's own block of the unit upper factor: applied as its inverse (a
    group x group solve) in one GEMM, where LAPACK's triangular solve against the n rows had run at ~20 GF/s."""
    eye = torch.eye(unit.shape[0])
    inverse = torch.linalg.solve_triangular(unit.contiguous(), eye, upper=True, unitriangular=True)
    return torch.addmm(original, inverse, sums - original)


def _features(wt, w0t, unit, qt, err, low, step, c0, c1, b0, top) -> None:
    """Features [c0, c1) of wt [K, n] rounded one at a time, last to first (grouped where `low`, each row's grid
    low + q * step), each one's error (its original weight in w0t less its rounded one) sent to the run's earlier
    features, weighted by the unit upper factor, and kept in err (feature f in its row f - b0): the binding's
    gptq_features, in torch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a feature's few-thousand-wide ops: waiting on a second thread costs more
    try:
        for col in range(c1 - 1, c0 - 1, -1):
            x = wt[col]
            if low is None:
                qi = torch.round(x / step).clamp_(-top, top)
                back = qi * step
            else:
                qi = torch.round((x - low) / step).clamp_(0, top)
                back = qi * step + low
            qt[col] = qi.to(qt.dtype)
            e = w0t[col] - back
            wt[c0:col] += unit[c0:col, col, None] * e[None, :]
            err[col - b0] = e
    finally:
        torch.set_num_threads(threads)
