"""Quantization parameters and the fake-quant references. Pure tensor maths: no modules, no kernels.

Conventions (those of the kernels that consume them):
- int8 weights: symmetric per output channel, q in [-127, 127], w ~= q * scale[n].
- int8 activations: symmetric per token (row), computed at run time.
- grouped b-bit weights (b = 4: int4; b = 2, ...): asymmetric per group of `group` input channels, q in
  [0, 2^b - 1], w ~= q * scale + min = (q - 2^(b-1)) * scale + zero, with zero = min + 2^(b-1) * scale (the
  int4pack kernels' form, as in gpt-fast, at any width).
"""

from __future__ import annotations

import math

import torch

INT8_MAX = 127
INT4_MID = 8  # 2^(4-1): the int4 kernels' zero point
EPS = 1e-8


def int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale float32 [N])."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=EPS) / INT8_MAX
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def int8_per_token(x: torch.Tensor, dtype: torch.dtype = torch.int8) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [M, K], scale float32 [M, 1]) for a 2-D activation: q the int8 values, held as `dtype` (bf16 holds
    them exactly, for a GEMM that takes bf16)."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_(min=EPS).div_(INT8_MAX)
    q = torch.div(x, scale).round_().clamp_(-INT8_MAX, INT8_MAX).to(dtype)
    return q, scale


def check_group(k: int, group: int) -> None:
    if group <= 0 or k % group:
        raise ValueError(f"group size {group} must divide the input features {k}")


def int_groups(
    w: torch.Tensor, group: int, bits: int, clip: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8 [N, K] in 0..2^bits-1, scale float32 [N, K/group], zero float32 [N, K/group]).

    `clip` ([N, K/group]) bounds each group's range to [-clip, clip] before the min/max are taken
    (AWQ's clipping search finds it).
    """
    n, k = w.shape
    check_group(k, group)
    top = (1 << bits) - 1
    g = w.float().reshape(n, k // group, group)
    if clip is not None:
        g = torch.max(torch.min(g, clip[..., None]), -clip[..., None])
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / top).clamp(min=1e-6)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, top).to(torch.uint8)
    return q.reshape(n, k), scale, lo + (1 << (bits - 1)) * scale


def int4_groups(w: torch.Tensor, group: int, clip: torch.Tensor | None = None):
    return int_groups(w, group, 4, clip)


def groups_dequant(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int, bits: int) -> torch.Tensor:
    n, k = q.shape
    g = q.float().reshape(n, k // group, group)
    return ((g - (1 << (bits - 1))) * scale[..., None] + zero[..., None]).reshape(n, k)


def int4_dequant(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> torch.Tensor:
    return groups_dequant(q, scale, zero, group, 4)


def pack_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    """[N, K] values below 2^bits (1 to 8 bits; K a multiple of 8) -> [N, K * bits / 8] uint8: a bit stream, each
    value's bits from its highest, so at 4 or 2 bits the first value of each byte sits in its highest bits (at 6, four
    values fill three bytes). The stored form where K is not whole blocks of the lane layout (pack_weights)."""
    n, k = q.shape
    if 8 % bits == 0:  # whole values a byte: in uint8, no wider copy (a 7B model's head is 131M values)
        per = 8 // bits
        v = q.to(torch.uint8).reshape(n, k // per, per)
        out = torch.zeros(n, k // per, dtype=torch.uint8, device=q.device)
        for i in range(per):
            out |= v[..., i] << (bits * (per - 1 - i))
        return out
    per = 8 // math.gcd(bits, 8)  # values a whole number of bytes holds: 4 at 6 bits
    v = q.to(torch.int64).reshape(n, k // per, per)
    word = torch.zeros(n, k // per, dtype=torch.int64, device=q.device)
    for i in range(per):  # at most 56 bits (7-bit values): exact in int64
        word |= v[..., i] << (bits * (per - 1 - i))
    nbytes = per * bits // 8
    out = torch.stack([(word >> (8 * (nbytes - 1 - j))) & 0xFF for j in range(nbytes)], dim=-1)
    return out.reshape(n, k * bits // 8).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """pack_bits undone: [N, K * bits / 8] uint8 -> [N, K] uint8."""
    n, m = packed.shape
    if 8 % bits == 0:
        per, mask = 8 // bits, (1 << bits) - 1
        out = torch.empty(n, m, per, dtype=torch.uint8, device=packed.device)
        for i in range(per):
            out[..., i] = (packed >> (bits * (per - 1 - i))) & mask
        return out.reshape(n, m * per)
    per = 8 // math.gcd(bits, 8)
    nbytes = per * bits // 8
    mask = (1 << bits) - 1
    # each value from the (at most two) bytes it spans, in 16-bit arithmetic: no int64 copy of the weight
    b = packed.reshape(n, m // nbytes, nbytes)
    out = torch.empty(n, m // nbytes, per, dtype=torch.uint8, device=packed.device)
    for i in range(per):
        first, last = (bits * i) // 8, (bits * i + bits - 1) // 8  # the bytes value i's bits lie in
        end = 8 * (last + 1) - bits * (i + 1)  # bits after value i in its last byte
        v = b[..., first].to(torch.int16)
        if last != first:
            v = (v << 8) | b[..., last].to(torch.int16)
        out[..., i] = ((v >> end) & mask).to(torch.uint8)
    return out.reshape(n, m // nbytes * per)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> [N, K/2] uint8, even columns in the high nibble (pack_bits at 4 bits): the bytes
    CUDA's int4 kernel packs from (src.quant.aten_ops.pack_int4)."""
    return pack_bits(q, 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return unpack_bits(packed, 4)


# --- the gemv kernels' lane layout, which the cache stores -----------------------------------------

BLOCK = 128  # values a block of the lane layout holds (core/api.h)
# A width that does not divide 16, as the two planes that do (core/api.h): the low bits' first.
SPLIT = {6: (4, 2), 5: (4, 1)}
ROWS_AT_ONCE = 1024  # rows packed together: a 4096-wide block is 4 MB of uint8


def pack_lanes(q: torch.Tensor, bits: int) -> torch.Tensor:
    """[N, K] values below 2^bits (K whole blocks of 128) -> quantspec's gemv layout (core/api.h): per 128 values,
    16 * bits bytes whose 16-bit lane i (of 8 * bits) holds values i + 8 * bits * u in its field u, from the lowest
    (the kernel shifts a lane to pick one). At 4 bits: lane i holds values i, i+32, i+64, i+96. A width in SPLIT is
    its planes, each in that layout, block by block: at 6 bits, 64 bytes of the low 4 bits, then 32 of the high 2;
    at 5, the 64 bytes of the low 4, then 16 of the high 1."""
    n, k = q.shape
    if bits in SPLIT:
        low, high = SPLIT[bits]
        planes = [pack_lanes(q & ((1 << low) - 1), low), pack_lanes(q >> low, high)]
        return torch.cat([p.reshape(n, k // BLOCK, -1) for p in planes], dim=2).reshape(n, k * bits // 8)
    lanes, fields = 8 * bits, 16 // bits
    low = fields // 2  # the fields a lane's low byte holds
    out = torch.empty(n, k // BLOCK, lanes, 2, dtype=torch.uint8, device=q.device)
    for r0 in range(0, n, ROWS_AT_ONCE):  # in uint8, a block of rows at a time: no wider copy of the weight
        b = q[r0 : r0 + ROWS_AT_ONCE].to(torch.uint8).reshape(-1, k // BLOCK, fields, lanes)
        for byte, first in ((0, 0), (1, low)):  # a lane's 16 bits as its two bytes, little-endian
            dest = out[r0 : r0 + ROWS_AT_ONCE, :, :, byte]
            dest.copy_(b[:, :, first])
            for u in range(1, low):
                dest |= b[:, :, first + u] << (bits * u)
    return out.reshape(n, k * bits // 8)


def unpack_lanes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """pack_lanes undone: [N, K * bits / 8] uint8 -> [N, K] uint8."""
    n, m = packed.shape
    k = m * 8 // bits
    if bits in SPLIT:
        low, high = SPLIT[bits]
        blocks = packed.reshape(n, k // BLOCK, 16 * bits)
        lo = unpack_lanes(blocks[..., : 16 * low].reshape(n, k * low // 8), low)
        return lo.bitwise_or_(unpack_lanes(blocks[..., 16 * low :].reshape(n, k * high // 8), high) << low)
    lanes, fields, mask = 8 * bits, 16 // bits, (1 << bits) - 1
    low = fields // 2
    b = packed.reshape(n, k // BLOCK, lanes, 2)
    out = torch.empty(n, k // BLOCK, fields, lanes, dtype=torch.uint8, device=packed.device)
    for byte, first in ((0, 0), (1, low)):
        for u in range(low):
            torch.bitwise_and(b[..., byte] >> (bits * u), mask, out=out[:, :, first + u])
    return out.reshape(n, k)


# --- the stored form of grouped weights ------------------------------------------------------------

LANES = "lanes"  # the field prefix of weights stored in the lane layout (`lanes4`); a bit stream's is `q`


def pack_weights(q: torch.Tensor, bits: int) -> dict[str, torch.Tensor]:
    """[N, K] b-bit values as the cache stores them: in the gemv kernels' lane layout (pack_lanes) as `lanes{bits}`
    where K is whole blocks of 128, so the kernels read it in place from the cache's mapped file, with no pass at
    load; else as a bit stream (pack_bits) as `q{bits}`."""
    if q.shape[1] % BLOCK == 0:
        return {f"{LANES}{bits}": pack_lanes(q, bits)}
    return {f"q{bits}": pack_bits(q, bits)}


def packed_weights(t: dict[str, torch.Tensor], bits: int) -> tuple[torch.Tensor, bool]:
    """(the packed bytes, whether in the lane layout) of a linear's stored tensors (pack_weights)."""
    lanes = t.get(f"{LANES}{bits}")
    return (lanes, True) if lanes is not None else (t[f"q{bits}"], False)


def unpack_weights(packed: torch.Tensor, bits: int, lanes: bool) -> torch.Tensor:
    """The [N, K] values of packed bytes in either stored form (packed_weights)."""
    return unpack_lanes(packed, bits) if lanes else unpack_bits(packed, bits)


def stored_values(t: dict[str, torch.Tensor], bits: int) -> torch.Tensor:
    """The [N, K] values of a linear's stored tensors, in whichever form they are stored."""
    packed, lanes = packed_weights(t, bits)
    return unpack_weights(packed, bits, lanes)


# --- fake quantization: references for tests and the loss inside AWQ's search, never the runtime path ---


def fake_int8_weight(w: torch.Tensor) -> torch.Tensor:
    q, scale = int8_per_channel(w)
    return q.float() * scale[:, None]


def fake_int8_act(x: torch.Tensor) -> torch.Tensor:
    q, scale = int8_per_token(x)
    return q.float() * scale


def fake_groups_weight(w: torch.Tensor, group: int, bits: int, clip: torch.Tensor | None = None) -> torch.Tensor:
    q, scale, zero = int_groups(w, group, bits, clip)
    return groups_dequant(q, scale, zero, group, bits)


def fake_int4_weight(w: torch.Tensor, group: int, clip: torch.Tensor | None = None) -> torch.Tensor:
    return fake_groups_weight(w, group, 4, clip)
