// The portable variant: plain C++ loops, one output at a time, sums in the order written. It is what
// every SIMD variant is checked against, and what runs where no SIMD variant fits (another architecture,
// an old CPU): slower than ATen's kernels there, but it keeps the quantized formats real.
#include <algorithm>
#include <cmath>
#include <vector>

#include "api.h"
#include "common.h"

namespace {

using namespace qs;

template <typename T>
void gemv_float(const T* x, const T* w, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += load(x + m * K, k) * load(w + n * K, k);
      y[m * N + n] = s;
    }
}
void gemv_f32(const float* x, const float* w, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  gemv_float(x, w, M, K, N, n0, n1, y);
}
void gemv_bf16(const uint16_t* x, const uint16_t* w, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1,
               float* y) {
  gemv_float(x, w, M, K, N, n0, n1, y);
}

void gemv_w8a8(const uint8_t* xq, const float* x_scale, const int8_t* w, const float* w_scale, const int32_t*,
               int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      int32_t s = 0;
      for (int64_t k = 0; k < K; ++k) s += int32_t(int8_t(xq[m * K + k])) * int32_t(w[n * K + k]);
      y[m * N + n] = float(s) * w_scale[n] * x_scale[m];
    }
}

// The integer sums are exact in int64 here; the SIMD variants fold int32 partial sums into fp32.
void gemv_w8a16(const int16_t* xq, const float* x_scale, const int8_t* w, const float* w_scale, int64_t M,
                int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      int64_t s = 0;
      for (int64_t k = 0; k < K; ++k) s += int64_t(xq[m * K + k]) * w[n * K + k];
      y[m * N + n] = float(s) * w_scale[n] * x_scale[m];
    }
}

// Value j (of 128) of a block of B-bit values packed as api.h's gemv_grouped says (B dividing 16).
template <int B>
inline int in_block(const uint8_t* block, int64_t j) {
  constexpr int64_t lanes = 8 * B;
  const uint8_t* lane = block + 2 * (j % lanes);
  const uint16_t bits = uint16_t(lane[0] | (lane[1] << 8));
  return (bits >> (B * (j / lanes))) & ((1 << B) - 1);
}

// Value k of row n of a B-bit weight packed as api.h's gemv_grouped says.
template <int B>
inline int field(const uint8_t* w, int64_t K, int64_t n, int64_t k) {
  return in_block<B>(w + n * (K * B / 8) + (k / 128) * 16 * B, k % 128);
}
// 6 bits: the low 4 in a 4-bit block's layout (64 bytes), then the high 2 in a 2-bit block's (32 bytes).
template <>
inline int field<6>(const uint8_t* w, int64_t K, int64_t n, int64_t k) {
  const uint8_t* block = w + n * (K * 6 / 8) + (k / 128) * 96;
  return in_block<4>(block, k % 128) | (in_block<2>(block + 64, k % 128) << 4);
}
// 5 bits: the low 4 in a 4-bit block's layout (64 bytes), then the high 1 in a 1-bit block's (16 bytes).
template <>
inline int field<5>(const uint8_t* w, int64_t K, int64_t n, int64_t k) {
  const uint8_t* block = w + n * (K * 5 / 8) + (k / 128) * 80;
  return in_block<4>(block, k % 128) | (in_block<1>(block + 64, k % 128) << 4);
}
inline int nibble(const uint8_t* w, int64_t K, int64_t n, int64_t k) { return field<4>(w, K, n, k); }

template <int B>
void gemv_grouped(const int16_t* xq, const float* x_scale, const float* group_sums, const uint8_t* w,
                  const float* scale, const float* offset, int64_t group, int64_t M, int64_t K, int64_t N, int64_t n0,
                  int64_t n1, float* y) {
  const int64_t G = K / group;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      double s = 0;   // sum over groups of scale * sum(q x) + offset * sum(x)
      for (int64_t g = 0; g < G; ++g) {
        int64_t d = 0;
        for (int64_t k = g * group; k < (g + 1) * group; ++k) d += int64_t(field<B>(w, K, n, k)) * xq[m * K + k];
        s += double(scale[n * G + g]) * double(d) + double(offset[n * G + g]) * double(group_sums[m * G + g]);
      }
      y[m * N + n] = float(s * x_scale[m]);
    }
}

// x's int8 value k of row m, from quantize_x8_w4's order.
inline int32_t x8_w4(const int8_t* xq, int64_t K, int64_t m, int64_t k) {
  return xq[m * K + (k / 128) * 128 + w4x_position(k % 128)];
}

void gemv_w4a8(const int8_t* xq, const float* x_scale, const float* group_sums, const uint8_t* w, const float* scale,
               const float* offset, int64_t group, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  const int64_t G = K / group;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      double s = 0;
      for (int64_t g = 0; g < G; ++g) {
        int64_t d = 0;
        for (int64_t k = g * group; k < (g + 1) * group; ++k) d += int64_t(nibble(w, K, n, k)) * x8_w4(xq, K, m, k);
        s += double(scale[n * G + g]) * double(d) + double(offset[n * G + g]) * double(group_sums[m * G + g]);
      }
      y[m * N + n] = float(s * x_scale[m]);
    }
}

template <int B>
void dequant_grouped(const uint8_t* w, const float* scale, const float* offset, int64_t group, int64_t K, int64_t n0,
                     int64_t n1, uint16_t* out) {
  const int64_t G = K / group;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k = 0; k < K; ++k)
      out[n * K + k] = f32_to_bf16(std::fma(float(field<B>(w, K, n, k)), scale[n * G + k / group], offset[n * G + k / group]));
}

// api.h's gemm_grouped_x8: each block's integer sum exact, folded in api.h's order.
template <int B>
void gemm_grouped_x8(const int8_t* xq, const float* xs, const float* xo, const uint8_t* w, const float* scale,
                     const float* offset, int64_t group, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1,
                     float* y) {
  const int64_t G = K / group, blocks = K / 128;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float acc = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t d = 0;
        for (int64_t k = 128 * b; k < 128 * (b + 1); ++k) d += field<B>(w, K, n, k) * int32_t(xq[m * K + k]);
        const int64_t g = n * G + 128 * b / group;
        acc = std::fma(float(d), scale[g] * xs[m * blocks + b], acc);
        acc = std::fma(offset[g], xo[m * blocks + b], acc);
      }
      y[m * N + n] = acc;
    }
}

template <typename T>
void attention(const T* q, const T* k, const T* v, int64_t head_stride, int64_t H, int64_t KVH, int64_t Q, int64_t L,
               int64_t D, float scale, int64_t i0, int64_t i1, T* out) {
  const int64_t group = H / KVH;
  std::vector<float> p(L), acc(D);
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t h = item / Q, i = item % Q, n = L - Q + i + 1;
    const T* kh = k + (h / group) * head_stride;
    const T* vh = v + (h / group) * head_stride;
    float top = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.f;
      for (int64_t d = 0; d < D; ++d) s += load(q + item * D, d) * load(kh + j * D, d);
      p[j] = s * scale;
      top = std::fmax(top, p[j]);
    }
    float total = 0.f;
    for (int64_t j = 0; j < n; ++j) total += (p[j] = std::exp(p[j] - top));
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t d = 0; d < D; ++d) acc[d] += p[j] * load(vh + j * D, d);
    for (int64_t d = 0; d < D; ++d) store(out + item * D, d, acc[d] / total);
  }
}

// Every grouped format has its reference kernel here (the others' fallback: api.h).
const qs_kernels table = [] {
  qs_kernels t = {QS_ABI, "reference", 1, gemv_f32, gemv_bf16, quantize_x8, gemv_w8a8, quantize_x16, gemv_w8a16,
                  quantize_x8_w4, gemv_w4a8, quantize_x8_bf16, scale_rows_bf16, rms_norm<float>, rms_norm<uint16_t>,
                  attention<float>, attention<uint16_t>};
  t.gemv_grouped[QS_W4A16] = gemv_grouped<4>;
  t.dequant_grouped[QS_W4A16] = dequant_grouped<4>;
  t.gemv_grouped[QS_W2A16] = gemv_grouped<2>;
  t.dequant_grouped[QS_W2A16] = dequant_grouped<2>;
  t.gemv_grouped[QS_W6A16] = gemv_grouped<6>;
  t.dequant_grouped[QS_W6A16] = dequant_grouped<6>;
  t.gemv_grouped[QS_W5A16] = gemv_grouped<5>;
  t.dequant_grouped[QS_W5A16] = dequant_grouped<5>;
  t.quantize_x8_blocks = quantize_x8_blocks;
  t.gemm_grouped_x8[QS_W4A16] = gemm_grouped_x8<4>;
  t.gemm_grouped_x8[QS_W2A16] = gemm_grouped_x8<2>;
  t.gemm_grouped_x8[QS_W6A16] = gemm_grouped_x8<6>;
  t.gemm_grouped_x8[QS_W5A16] = gemm_grouped_x8<5>;
  return t;
}();

}  // namespace

extern "C" const qs_kernels* qs_kernels_get(void) { return &table; }
