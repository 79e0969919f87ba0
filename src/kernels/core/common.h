// Scalar pieces every variant shares: bf16 conversion as c10::BFloat16 does it, the activation
// quantizers' arithmetic, and RMSNorm (plain loops: each variant compiles them with its own flags;
// -ffp-contract=off keeps them the same arithmetic on every variant).
#pragma once

#include <stdint.h>
#include <string.h>

#include <cmath>

namespace qs {

inline float bf16_to_f32(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays a (quiet) NaN: torch's own conversion.
// Without a branch, so that loops of conversions are vectorised.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint16_t rounded = uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  return (u & 0x7FFFFFFF) > 0x7F800000 ? uint16_t(0x7FC0) : rounded;
}

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }

// A row's quantization scale: max|x| (at least `floor`) over the integer range.
inline float row_scale(const float* row, int64_t K, float qmax, float floor) {
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::fmax(amax, std::fabs(row[k]));
  return std::fmax(amax, floor) / qmax;
}

// The quantizers' scales and roundings (the SIMD variants compute the same, lane by lane): int8 divides
// by the scale, int16 multiplies by its inverse; both round half to even.
constexpr float kX8Floor = 1e-8f, kX16Floor = 1e-30f;
inline int32_t quant8(float x, float scale) {
  const float q = std::nearbyint(x / scale);
  return int32_t(std::fmin(std::fmax(q, -127.f), 127.f));
}
inline int32_t quant16(float x, float inv) {
  const float q = std::nearbyint(x * inv);
  return int32_t(std::fmin(std::fmax(q, -32767.f), 32767.f));
}

// The quantizers in scalar code, for the variants whose SIMD versions would gain little (a few
// microseconds a row against the weights' milliseconds). int8 is stored as its two's-complement byte.
inline void quantize_x8(const float* x, int64_t M, int64_t K, uint8_t* q, float* x_scale) {
  for (int64_t m = 0; m < M; ++m) {
    const float scale = row_scale(x + m * K, K, 127.f, kX8Floor);
    x_scale[m] = scale;
    for (int64_t k = 0; k < K; ++k) q[m * K + k] = uint8_t(int8_t(quant8(x[m * K + k], scale)));
  }
}

inline void quantize_x16(const float* x, int64_t M, int64_t K, int64_t group, int16_t* q, float* x_scale,
                         float* group_sums) {
  for (int64_t m = 0; m < M; ++m) {
    const float scale = row_scale(x + m * K, K, 32767.f, kX16Floor), inv = 1.f / scale;
    x_scale[m] = scale;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t v = quant16(x[m * K + k], inv);
      q[m * K + k] = int16_t(v);
      sum += v;
      if (group > 0 && (k + 1) % group == 0) {
        group_sums[m * (K / group) + k / group] = float(sum);
        sum = 0;
      }
    }
  }
}

// w4a8's activations: int8 as quant8 (scale = max|x| / 127, round half to even), each 128 values laid out
// to meet the packed int4 weights byte for byte (api.h's layout: byte 2i of a 64-byte block holds values i and
// i + 32 in its low and high nibbles, byte 2i + 1 values i + 64 and i + 96). Byte b of a block's first 64 is the
// value that weight byte b's low nibble holds, byte 64 + b the one its high nibble holds: a SIMD variant masks
// (low) or shifts and masks (high) a weight register and meets x at the same byte offset, whatever its width.
inline int64_t w4x_position(int64_t j) {  // j: a value's index within its block of 128
  const int64_t i = j % 32, u = j / 32;
  return (u & 1) * 64 + 2 * i + (u >> 1);
}

// x [M, K] (K a multiple of 128) to int8 in w4x_position's order, with each group's sum of q (float [M, K/group]).
inline void quantize_x8_w4(const float* x, int64_t M, int64_t K, int64_t group, int8_t* q, float* x_scale,
                           float* group_sums) {
  for (int64_t m = 0; m < M; ++m) {
    const float scale = row_scale(x + m * K, K, 127.f, kX8Floor);
    x_scale[m] = scale;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t v = quant8(x[m * K + k], scale);
      q[m * K + (k / 128) * 128 + w4x_position(k % 128)] = int8_t(v);
      sum += v;
      if ((k + 1) % group == 0) {
        group_sums[m * (K / group) + k / group] = float(sum);
        sum = 0;
      }
    }
  }
}

// w4a8's prefill: rows r0..r1 of bf16 x [., K] quantized per row as quant8 (scale = max|x| / 127), each q written
// as bf16 (exact: |q| <= 127) for one bf16 GEMM of the int8 values; then that GEMM's bf16 rows scaled back,
// bf16(float(y) * scale). One pass each, where ATen's ops make five temporaries of x's size.
inline void quantize_x8_bf16(const uint16_t* x, int64_t K, int64_t r0, int64_t r1, uint16_t* q, float* x_scale) {
  for (int64_t m = r0; m < r1; ++m) {
    const uint16_t* row = x + m * K;
    float amax = 0.f;
    for (int64_t k = 0; k < K; ++k) {  // a compare, not fmax: GCC 12 for AArch64 fails vectorizing that reduction
      const float v = std::fabs(bf16_to_f32(row[k]));
      amax = v > amax ? v : amax;
    }
    const float scale = std::fmax(amax, kX8Floor) / 127.f;
    x_scale[m] = scale;
    for (int64_t k = 0; k < K; ++k) q[m * K + k] = f32_to_bf16(float(quant8(bf16_to_f32(row[k]), scale)));
  }
}

// Many rows on int8 activations (api.h's quantize_x8_blocks): each block of 128 values of bf16 x its own scale
// (max|x| / 127, as quant8 rounds), the block's q in x's order, and xo = scale * (the block's sum of q).
// Per block rather than per row, as llama.cpp's Q8_K keeps a scale per 256 values: one large activation
// then coarsens its own block, not the whole row (the quality page has the measurement).
inline void quantize_x8_blocks(const uint16_t* x, int64_t K, int64_t r0, int64_t r1, int8_t* q, float* xs, float* xo) {
  const int64_t blocks = K / 128;
  for (int64_t m = r0; m < r1; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      const uint16_t* in = x + m * K + 128 * b;
      float amax = 0.f;
      for (int k = 0; k < 128; ++k) {  // a compare, not fmax: as quantize_x8_bf16 (GCC 12 for AArch64)
        const float v = std::fabs(bf16_to_f32(in[k]));
        amax = v > amax ? v : amax;
      }
      const float scale = std::fmax(amax, kX8Floor) / 127.f;
      int32_t sum = 0;
      for (int k = 0; k < 128; ++k) {
        const int32_t v = quant8(bf16_to_f32(in[k]), scale);
        q[m * K + 128 * b + k] = int8_t(v);
        sum += v;
      }
      xs[m * blocks + b] = scale;
      xo[m * blocks + b] = scale * float(sum);
    }
}

// The int8 GEMM's panel (api.h's gemm_grouped_x8) of `width` output columns from n: their scales and offsets as
// [G][width], the columns at or past N zero (the SIMD variants' panels pad so).
inline void x8_panel_scales(const float* scale, const float* offset, int64_t G, int64_t N, int64_t n, int64_t width,
                            float* sc, float* of) {
  for (int64_t g = 0; g < G; ++g)
    for (int64_t j = 0; j < width; ++j) {
      const bool in = n + j < N;
      sc[g * width + j] = in ? scale[(n + j) * G + g] : 0.f;
      of[g * width + j] = in ? offset[(n + j) * G + g] : 0.f;
    }
}

inline void scale_rows_bf16(uint16_t* y, int64_t N, const float* x_scale, int64_t r0, int64_t r1) {
  for (int64_t m = r0; m < r1; ++m)
    for (int64_t n = 0; n < N; ++n) y[m * N + n] = f32_to_bf16(bf16_to_f32(y[m * N + n]) * x_scale[m]);
}

// x's sum of squares in 16 running sums (lane i takes every 16th value from i), added pairwise at the
// end, the rest after: one order of additions on every variant (bit for bit alike), which the SIMD
// variants' compilers vectorise; a single running sum was a chain of dependent adds, ~4 cycles a value.
constexpr int kNormLanes = 16;
template <typename T>
float sum_of_squares(const T* x, int64_t d) {
  float lanes[kNormLanes] = {};
  const int64_t whole = d - d % kNormLanes;
  for (int64_t i = 0; i < whole; i += kNormLanes)
    for (int j = 0; j < kNormLanes; ++j) lanes[j] += load(x, i + j) * load(x, i + j);
  for (int width = kNormLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  float ss = lanes[0];
  for (int64_t i = whole; i < d; ++i) ss += load(x, i) * load(x, i);
  return ss;
}

// The two RMSNorm conventions (Gemma3RMSNorm; LlamaRMSNorm and Qwen2RMSNorm), in T's precision.
template <typename T>
void rms_norm(const T* x, const T* w, int64_t d, float eps, int gemma, int64_t r0, int64_t r1, T* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    const float ss = sum_of_squares(xr, d);
    const float inv = 1.f / std::sqrt(ss / float(d) + eps);
    if (gemma) {
      for (int64_t i = 0; i < d; ++i) store(yr, i, load(xr, i) * inv * (1.f + load(w, i)));
    } else {  // x r rounded to T first, then times the weight
      for (int64_t i = 0; i < d; ++i) {
        T rounded;
        store(&rounded, 0, load(xr, i) * inv);
        store(yr, i, load(&rounded, 0) * load(w, i));
      }
    }
  }
}

}  // namespace qs
