// The one interface every kernel variant exports: a table of plain C functions over raw buffers, no torch
// and no STL across the boundary, so each variant is its own shared library built with its own ISA
// flags (variants in one library would share inline template copies compiled for the widest ISA: an
// AVX-512 std::min picked by the linker for the AVX2 code), and the same code is testable under an
// emulator without torch (selftest.cpp).
//
// Conventions, for every variant:
//   matrices are row-major; y is float32 [M, N]; a gemv fills the columns n0 <= n < n1 of all M rows
//   (the caller splits N across threads); n0 is a multiple of 4.
//   bf16 values travel as their uint16 bits.
//   Row independence: each row of y depends on that row of x alone, never on M (a draft's verification
//   of k tokens must give the logits of k single steps, bit for bit).
#pragma once

#include <stdint.h>

#define QS_ABI 5

// Every weight format the kernels know, in one list: its kind (the Stepper's, step.cpp), its name (the one
// src.quant.formats gives it) and its weight bits. A format's number is its place here; Python reads the list
// through the binding (torch.ops.quantspec.formats), so the two never disagree. A new format goes at the end.
#define QS_FORMATS(X)   \
  X(FLOAT, "float", 0)  \
  X(W8A8, "w8a8", 8)    \
  X(W8A16, "w8a16", 8)  \
  X(W4A16, "w4a16", 4)  \
  X(W4A8, "w4a8", 4)    \
  X(W2A16, "w2a16", 2)   \
  X(W6A16, "w6a16", 6)  \
  X(W5A16, "w5a16", 5)

#define QS_FORMAT_ENUM(kind, name, bits) QS_##kind,
enum qs_format { QS_FORMATS(QS_FORMAT_ENUM) QS_FORMAT_COUNT };
#undef QS_FORMAT_ENUM
// The grouped tables' size: room for formats not yet written, so adding one changes no table's layout.
#define QS_MAX_FORMATS 16

extern "C" {

typedef struct qs_kernels {
  int abi;             // QS_ABI
  const char* name;    // the variant: "avx512", "avx2", "neon_dotprod", "neon", "reference"
  int x8_bytes;        // bytes per element of quantize_x8's output (its encoding is the variant's own)

  void (*gemv_f32)(const float* x, const float* w, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1,
                   float* y);
  // x and w bf16
  void (*gemv_bf16)(const uint16_t* x, const uint16_t* w, int64_t M, int64_t K, int64_t N, int64_t n0,
                    int64_t n1, float* y);

  // w8a8: x rows quantized to int8 (scale = max|x| / 127, round half to even, |q| <= 127), written in the
  // variant's encoding; then int32 dot products with int8 weights, scaled by w_scale[n] * x_scale[m].
  void (*quantize_x8)(const float* x, int64_t M, int64_t K, uint8_t* q, float* x_scale);
  void (*gemv_w8a8)(const uint8_t* xq, const float* x_scale, const int8_t* w, const float* w_scale,
                    const int32_t* w_sum, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y);

  // w8a16, w4a16: x rows quantized to int16 (scale = max|x| / 32767, round half to even); with group > 0
  // also each group's sum of q, as float [M, K / group].
  void (*quantize_x16)(const float* x, int64_t M, int64_t K, int64_t group, int16_t* q, float* x_scale,
                       float* group_sums);
  void (*gemv_w8a16)(const int16_t* xq, const float* x_scale, const int8_t* w, const float* w_scale, int64_t M,
                     int64_t K, int64_t N, int64_t n0, int64_t n1, float* y);
  // w4a8: x rows quantized to int8 (as quantize_x8) in the order that meets the packed int4 bytes (common.h's
  // w4x_position, the same on every variant), with each group's sum of q as float [M, K / group]; then int32
  // dot products of the nibbles (0..15, unsigned) with them, each group's sum scaled as gemv_w4a16's.
  void (*quantize_x8_w4)(const float* x, int64_t M, int64_t K, int64_t group, int8_t* q, float* x_scale,
                         float* group_sums);
  void (*gemv_w4a8)(const int8_t* xq, const float* x_scale, const float* group_sums, const uint8_t* w,
                    const float* scale, const float* offset, int64_t group, int64_t M, int64_t K, int64_t N,
                    int64_t n0, int64_t n1, float* y);
  // w4a8's prefill (common.h): rows r0..r1 of bf16 x (K a multiple of 128) quantized to int8 values held as
  // bf16, and x_scale; the GEMM's bf16 rows r0..r1 scaled back in place.
  void (*quantize_x8_bf16)(const uint16_t* x, int64_t K, int64_t r0, int64_t r1, uint16_t* q, float* x_scale);
  void (*scale_rows_bf16)(uint16_t* y, int64_t N, const float* x_scale, int64_t r0, int64_t r1);

  // RMSNorm of rows r0..r1 (gemma: y = x r (1 + w); else y = w * round(x r)), r = 1 / sqrt(mean(x^2) + eps).
  void (*rms_norm_f32)(const float* x, const float* w, int64_t d, float eps, int gemma, int64_t r0, int64_t r1,
                       float* y);
  void (*rms_norm_bf16)(const uint16_t* x, const uint16_t* w, int64_t d, float eps, int gemma, int64_t r0,
                        int64_t r1, uint16_t* y);

  // Attention of queries q [H, Q, D] over k, v [KVH, L, D] (heads head_stride elements apart, rows of D
  // contiguous), query i seeing keys 0 .. L - Q + i; items i0..i1 of the H * Q (head, query) pairs.
  void (*attention_f32)(const float* q, const float* k, const float* v, int64_t head_stride, int64_t H,
                        int64_t KVH, int64_t Q, int64_t L, int64_t D, float scale, int64_t i0, int64_t i1,
                        float* out);
  void (*attention_bf16)(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t head_stride, int64_t H,
                         int64_t KVH, int64_t Q, int64_t L, int64_t D, float scale, int64_t i0, int64_t i1,
                         uint16_t* out);

  // Grouped weight-only formats (w4a16, ...), by format number; null where a variant has no kernel of its
  // own, filled at load from the variants below it that the CPU runs, the reference variant last (binding.cpp),
  // so a format can land with its reference kernel alone and gain SIMD variants later. x rows as quantize_x16 gives them, with group sums. A b-bit
  // weight is packed per 128 values into 16 * b bytes, whose 16-bit lane i (of 8 * b) holds values
  // i + 8 * b * u in its field u (b bits, from the lowest); w = q * scale + offset per group of `group` (a
  // multiple of 128) along K. A width that does not divide 16 is split into two that do, each in that layout,
  // the low bits' plane first: 6 bits are 64 bytes of the low 4 bits, then 32 bytes of the high 2; 5 bits are
  // the 64 bytes of the low 4, then 16 of the high 1 (lane i of 8 holds values i + 8u in its bit u).
  void (*gemv_grouped[QS_MAX_FORMATS])(const int16_t* xq, const float* x_scale, const float* group_sums,
                                       const uint8_t* w, const float* scale, const float* offset, int64_t group,
                                       int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y);
  // Rows n0..n1 of a grouped weight as bf16 [N, K]: fp32 q * scale + offset (one fused multiply-add), rounded
  // to nearest even.
  void (*dequant_grouped[QS_MAX_FORMATS])(const uint8_t* w, const float* scale, const float* offset, int64_t group,
                                          int64_t K, int64_t n0, int64_t n1, uint16_t* out);
  // Quantization's GEMMs (a calibration Gram X^T X, GPTQ's error updates): c [M, N] float32 (rows ldc apart) +=
  // A [M, 2 K2] B [2 K2, N] for rows m0..m1, bf16 operands summed in float32, A's bf16 row-major (as uint32 pairs
  // along the sum: a [M, K2], rows lda pairs apart), B packed by panels of 32 columns with its rows 2k and 2k + 1 interleaved (bp
  // [ceil(N / 32), K2, 32]: panel p, pair k, column 32 p + j; columns past N zero). upper: of each row m only the
  // columns n >= m, from the start of m's 32-column panel, are summed (a Gram's upper triangle and a few before
  // it); the rest of c is not touched. Null where the variant has no bf16 dot product (the caller's own GEMM then).
  void (*gemm_bf16)(const uint32_t* a, int64_t lda, const uint32_t* bp, int64_t K2, int64_t N, int64_t m0,
                    int64_t m1, int upper, float* c, int64_t ldc);

  // Many rows of a grouped format on int8 activations (a prefill's calls, precision.prefill_activations=int8):
  // rows r0..r1 of bf16 x [., K] (K a multiple of 128) quantized per block of 128 values, in x's own order, to
  // int8 (the block's scale xs = max|x| / 127, round half to even, as quant8), with xo = xs * (the block's sum of
  // q) beside it (both float [M, K / 128]).
  void (*quantize_x8_blocks)(const uint16_t* x, int64_t K, int64_t r0, int64_t r1, int8_t* q, float* xs, float* xo);
  // Then y [M, N] columns n0..n1 (any n0: a column is computed alike wherever its panel starts) = per block b of
  // 128 values (weight group g, a group a multiple of 128), in order from acc = 0:
  // acc = fma(float(sum of q_w * q_x), scale[n, g] * xs[m, b], acc);
  // acc = fma(offset[n, g], xo[m, b], acc): the weight's unsigned b-bit values against x's int8 ones, summed
  // exactly (u8 x s8 dot products: VPDPBUSD), the same floats on every variant. Null where a variant has no
  // kernel of its own; not filled from below (the reference's loops would be slower than a bf16 GEMM): the
  // caller then multiplies the same int8 x in its own GEMM.
  void (*gemm_grouped_x8[QS_MAX_FORMATS])(const int8_t* xq, const float* xs, const float* xo, const uint8_t* w,
                                          const float* scale, const float* offset, int64_t group, int64_t M, int64_t K,
                                          int64_t N, int64_t n0, int64_t n1, float* y);
} qs_kernels;

// A format's weight bits (0: float), by number.
static inline int qs_format_bits(int format) {
#define QS_FORMAT_BITS(kind, name, bits) bits,
  static const int bits[] = {QS_FORMATS(QS_FORMAT_BITS)};
#undef QS_FORMAT_BITS
  return format >= 0 && format < QS_FORMAT_COUNT ? bits[format] : -1;
}

// Each variant library exports this one symbol.
__attribute__((visibility("default"))) const qs_kernels* qs_kernels_get(void);

}  // extern "C"
