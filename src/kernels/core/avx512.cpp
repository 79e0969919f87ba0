// The AVX-512 variant (F, BW, VL, DQ, BF16, VNNI): small-batch matmuls y[M, N] = x[M, K] @ W[N, K]^T
// for a few rows M (a decode step is 1, verifying k draft tokens is k), for each weight format a
// decode step reads:
//   gemv_f32    W fp32, FMA                        gemv_bf16  W bf16, VDPBF16PS (32 MACs/op)
//   gemv_w8a8   W int8, x int8 as u8 + 128 (VPDPBUSD: 64 MACs/op)
//   gemv_w8a16  W int8 split into int16 by shifts, x int16 paired to match (VPDPWSSD: 32 MACs/op)
//   w4a16       W int4 in groups, x int16 (VPDPWSSD on the nibbles; each group's sum scaled in fp32)
//   w6a16, w5a16  W 6 or 5 bits in groups, as w4a16 with each step's high bits merged in (Split)
// (the grouped formats through blocking.h's grouped_gemv), their unpacking to bf16 for a prefill's GEMM
// (dequant_w4a16, dequant_split) and attention for a few queries; and one GEMM of many rows, quantization's
// (gemm_bf16: float32 sums of bf16 products, VDPBF16PS, for calibration Grams and GPTQ's updates).
// Every weight vector loaded is used for all M rows in registers, so verifying k tokens reads W once.
//
// Why our own: a decode step is memory bound, and a conversion per element (int8 -> fp32, bf16 -> fp32)
// makes a plain FMA loop compute bound below the memory's speed; the dot-product instructions take the
// weights as they are stored. The 16-bit activation formats take int16 activations, not bf16: bf16 would
// need every weight converted first, twice the instructions per weight (docs/concepts/kernels.md has the
// measurements behind each choice here).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "api.h"
#include "common.h"

namespace {

using namespace qs;

// Four sums at once (lane i: the sum of a[i]'s 16 lanes): a transposing add tree instead of 4 reductions
// (a row of K = 640 is only 10-40 steps, so 4 separate reductions cost as much as the dot products).
inline __m128 sum4(const __m512* a) {
  const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
  const __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
  const __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y))),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y))));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
inline __m128i sum4(const __m512i* a) {
  const __m512i x = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
  const __m512i y = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
  const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

constexpr int kRows = 4;   // weight rows per block: 4 independent accumulator chains per x row
constexpr int kMaxM = 6;   // x rows per pass: 6 x 4 accumulators + 4 weight registers fit in 32

// --- formats: how to load a weight register and a matching x register, and finish a sum ----------
inline __m128 sum1(__m512 a) { return _mm_set_ss(_mm512_reduce_add_ps(a)); }
inline __m128i sum1(__m512i a) { return _mm_cvtsi32_si128(_mm512_reduce_add_epi32(a)); }

// Formats without per-group state scan all of K as one span.
struct NoState {};

// A row-major [N, K] weight of element W and activations [M, K] of element X, one span per row, sums
// taken as they are (a format with per-row scales has its own finish).
template <typename W, typename X>
struct Dense {
  using State = NoState;
  static constexpr int kSub = 1;  // one load per step
  const W* w; const X* x; int64_t K;
  int64_t span() const { return K; }
  State begin(int64_t, int64_t) const { return {}; }
  const W* at(int64_t n, int64_t k) const { return w + n * K + k; }
  const X* x_at(int m, int64_t k) const { return x + m * K + k; }
  __m128 finish(__m128 sums, int64_t, int, int) const { return sums; }
};

struct F32 : Dense<float, float> {  // 16 per step, plain FMA (the fp32 reference precision)
  using Acc = __m512; using V = __m512; static constexpr int kStep = 16;
  using Sum = Acc; static Sum sum_zero() { return zero(); }
  V wv(const State&, int64_t n, int64_t k) const { return _mm512_loadu_ps(at(n, k)); }
  V xv(int m, int64_t k) const { return _mm512_loadu_ps(x_at(m, k)); }
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc madd(Acc a, V w, V x) { return _mm512_fmadd_ps(w, x, a); }
};

struct Bf16 : Dense<uint16_t, uint16_t> {  // 32 per step: bf16 pairs multiplied and summed into fp32 lanes
  using Acc = __m512; using V = __m512bh; static constexpr int kStep = 32;
  using Sum = Acc; static Sum sum_zero() { return zero(); }
  V wv(const State&, int64_t n, int64_t k) const { return (V)_mm512_loadu_si512(at(n, k)); }
  V xv(int m, int64_t k) const { return (V)_mm512_loadu_si512(x_at(m, k)); }
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc madd(Acc a, V w, V x) { return _mm512_dpbf16_ps(a, w, x); }
};

struct W8A8 : Dense<int8_t, uint8_t> {  // 64 per step: u8 activations (int8 + 128) x s8 weights into int32 lanes
  using Acc = __m512i; using V = __m512i; static constexpr int kStep = 64;
  using Sum = Acc; static Sum sum_zero() { return zero(); }
  const float* w_scale; const int32_t* w_sum; const float* x_scale;
  V wv(const State&, int64_t n, int64_t k) const { return _mm512_loadu_si512(at(n, k)); }
  V xv(int m, int64_t k) const { return _mm512_loadu_si512(x_at(m, k)); }
  static Acc zero() { return _mm512_setzero_si512(); }
  static Acc madd(Acc a, V w, V x) { return _mm512_dpbusd_epi32(a, x, w); }
  // sum (q + 128) w = sum q w + 128 sum w: the row sums undo the offset. `lanes` rows from n.
  __m128 finish(__m128i sums, int64_t n, int m, int lanes) const {
    const __mmask8 k = (1 << lanes) - 1;
    const __m128i offset = _mm_slli_epi32(_mm_maskz_loadu_epi32(k, w_sum + n), 7);
    const __m128 ws = _mm_maskz_loadu_ps(k, w_scale + n);
    return _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(sums, offset)), ws), _mm_set1_ps(x_scale[m]));
  }
};

// int4, unpacked to bf16 for a prefill's GEMM (dequant_w4a16): 128 values per 64 bytes, 16-bit lane i
// holding values i, i + 32, i + 64 and i + 96 in its four nibbles, the layout qparams.pack_lanes makes (the cache stores it).
// A group's 16 possible weights, q * scale + offset, go into one register as bf16, twice (entries
// 0..15 and 16..31); VPERMW looks up each lane's low 5 bits, so shifting the lane by 0, 4, 8 or 12
// selects a nibble with no masking.
struct W4Unpack {
  using State = __m512i;
  const uint8_t* w; int64_t K; const float* scale; const float* offset; int64_t group;
  State table(int64_t n, int64_t k) const {
    const int64_t g = n * (K / group) + k / group;
    const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 v = _mm512_fmadd_ps(q, _mm512_set1_ps(scale[g]), _mm512_set1_ps(offset[g]));
    return (__m512i)_mm512_cvtne2ps_pbh(v, v);  // entries 0..15 and again 16..31
  }
  // Values k + 32u .. k + 32u + 31 (u = 0..3) of row n as bf16.
  __m512i bf16(const State& table, int64_t n, int64_t k, int u) const {
    const __m512i v = _mm512_loadu_si512(w + n * (K / 2) + k / 2);
    return _mm512_permutexvar_epi16(_mm512_srlv_epi16(v, _mm512_set1_epi16(4 * u)), table);
  }
};

// --- 16-bit integer activations -----------------------------------------------------------------
// x quantized per row to int16 (scale = max|x| / 32767: for every element within 2^-8 of the row's
// largest at least bf16's precision, and never a rounding of the weight), then VPDPWSSD: 32 int16 pairs
// multiplied and summed into int32 lanes, one instruction per 32 weights, as VDPBF16PS, but the weights
// need no conversion to bf16 (w8a16: one sign extension; w4a16: a shift and a mask, no table lookup).
// The int32 lanes are folded into fp32 once per span: per int4 group (its scale) or every 4096 values
// (int8: 127 * 32767 * 2 per instruction per lane, 128 of them stay below 2^31).
struct Int16X {
  using Acc = __m512i; using V = __m512i; static constexpr int kStep = 32; static constexpr bool kFolds = true;
  using Sum = __m512; static Sum sum_zero() { return _mm512_setzero_ps(); }
  const int16_t* x; int64_t K; const float* x_scale;
  V xv(int m, int64_t k) const { return _mm512_loadu_si512(x + m * K + k); }
  static Acc zero() { return _mm512_setzero_si512(); }
  static Acc madd(Acc a, V w, V x) { return _mm512_dpwssd_epi32(a, w, x); }
};

struct W8A16 : Int16X {  // 32 per step: int8 weights sign-extended to int16 (W8A16Pairs below where K % 64 == 0)
  using State = NoState; static constexpr int kSub = 1;
  const int8_t* w; const float* w_scale;
  int64_t span() const { return std::min<int64_t>(K, 4096); }
  State begin(int64_t, int64_t) const { return {}; }
  const int8_t* at(int64_t n, int64_t k) const { return w + n * K + k; }
  V wv(const State&, int64_t n, int64_t k) const {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(n, k))));
  }
  static __m512 fold(__m512 sum, Acc a, const State&) { return _mm512_add_ps(sum, _mm512_cvtepi32_ps(a)); }
  __m128 finish(__m128 sums, int64_t n, int m, int lanes) const {
    return _mm_mul_ps(_mm_mul_ps(sums, _mm_maskz_loadu_ps((1 << lanes) - 1, w_scale + n)), _mm_set1_ps(x_scale[m]));
  }
};

// int8 weights read 64 at a time and split in place by shifts, no shuffle: each 16-bit lane holds two
// weights, the even-indexed one in its low byte, the odd in its high byte; shifted left then right by 8
// (arithmetic), or right by 8, each becomes an int16. x comes in the same split (pair_x: each 64 values
// as their 32 even-indexed ones, then the 32 odd), so steps u = 0, 1 of a load meet their own x. Why: the
// sign extension VPMOVSXBW is a lane-crossing shuffle, and a kernel of one shuffle per load runs out of
// shuffle ports before memory bandwidth. Each 32-bit lane sums its own k: results differ from another
// order of summation within float rounding, as between variants.
struct W8A16Pairs : Int16X {
  using State = NoState; static constexpr int kSub = 2;
  const int8_t* w; const float* w_scale;
  int64_t span() const { return std::min<int64_t>(K, 4096); }
  State begin(int64_t, int64_t) const { return {}; }
  const int8_t* at(int64_t n, int64_t k) const { return w + n * K + k; }
  V wv(const State&, int64_t n, int64_t k, int u) const {
    const __m512i v = _mm512_loadu_si512(at(n, k));
    return u == 0 ? _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8) : _mm512_srai_epi16(v, 8);
  }
  static __m512 fold(__m512 sum, Acc a, const State&) { return _mm512_add_ps(sum, _mm512_cvtepi32_ps(a)); }
  __m128 finish(__m128 sums, int64_t n, int m, int lanes) const {
    return _mm_mul_ps(_mm_mul_ps(sums, _mm_maskz_loadu_ps((1 << lanes) - 1, w_scale + n)), _mm_set1_ps(x_scale[m]));
  }
};

// x [M, K] (K a multiple of 64) -> each 64 values as their 32 even-indexed, then their 32 odd-indexed.
inline void pair_x(const int16_t* x, int64_t M, int64_t K, int16_t* out) {
  const __m512i even = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26,
                                        24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
  for (int64_t i = 0; i < M * K; i += 64) {
    const __m512i a = _mm512_loadu_si512(x + i), b = _mm512_loadu_si512(x + i + 32);
    _mm512_storeu_si512(out + i, _mm512_permutex2var_epi16(a, even, b));
    _mm512_storeu_si512(out + i + 32, _mm512_permutex2var_epi16(a, odd, b));
  }
}

// An int4 format's last step (w = q * scale + offset per group): the offsets' share, sum over groups of
// offset x x's group sum, then x's scale. A few groups a row (5 for K = 640): a plain loop, since a vector
// reduction per row costs more than it sums; many (86 for K = 11008): 16 at a time.
inline __m128 int4_finish(__m128 sums, const float* offset, const float* x_group, int64_t G, float x_scale, int64_t n,
                          int m, int lanes) {
  alignas(16) float off[4] = {0, 0, 0, 0};
  for (int r = 0; r < lanes; ++r) {
    const float* o = offset + (n + r) * G;
    const float* xg = x_group + m * G;
    if (G <= 16) {
      float acc = 0.f;
      for (int64_t g = 0; g < G; ++g) acc = std::fma(o[g], xg[g], acc);
      off[r] = acc;
      continue;
    }
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g += 16) {
      const __mmask16 k = G - g >= 16 ? 0xFFFF : (1 << (G - g)) - 1;
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, o + g), _mm512_maskz_loadu_ps(k, xg + g), acc);
    }
    off[r] = _mm512_reduce_add_ps(acc);
  }
  return _mm_mul_ps(_mm_add_ps(sums, _mm_load_ps(off)), _mm_set1_ps(x_scale));
}

// What every grouped weight-only format of B bits shares (api.h's layout): int16 x, 128 values a group of
// loads (4 steps of 32), each group's integer sums folded into fp32 by its scale, the offsets met by x's group sums
// in `finish`.
template <int B>
struct Grouped : Int16X {
  using State = float; static constexpr int kSub = 4, kBits = B;
  const uint8_t* w; const float* scale; const float* offset; const float* x_group; int64_t group;
  int64_t span() const { return group; }
  State begin(int64_t n, int64_t k) const { return scale[n * (K / group) + k / group]; }
  const uint8_t* at(int64_t n, int64_t k) const { return w + n * (K * B / 8) + k * B / 8; }
  static __m512 fold(__m512 sum, Acc a, const State& s) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(s), sum);
  }
  __m128 finish(__m128 sums, int64_t n, int m, int lanes) const {
    return int4_finish(sums, offset, x_group, K / group, x_scale[m], n, m, lanes);
  }
};

// Nibble u (0..3) of every 16-bit lane as an int16: the lowest needs no shift, the highest no mask.
template <int u>
inline __m512i nibble(__m512i v) {
  if constexpr (u == 3) return _mm512_srli_epi16(v, 12);
  else if constexpr (u == 0) return _mm512_and_si512(v, _mm512_set1_epi16(0xF));
  else return _mm512_and_si512(_mm512_srli_epi16(v, 4 * u), _mm512_set1_epi16(0xF));
}

// int4 in pack_lanes' layout (see W4Unpack above): nibble u of each 16-bit lane, masked, is the weight q (0..15)
// as an int16. w = q * scale + offset per group: the int32 sum of q * x is scaled once per group, and
// the offsets meet the group sums of x (x_group) in `finish`.
struct W4A16 : Grouped<4> {
  V wv(const State&, int64_t n, int64_t k, int u) const {
    const __m512i v = _mm512_loadu_si512(at(n, k));
    switch (u) {
      case 1: return nibble<1>(v);
      case 2: return nibble<2>(v);
      case 3: return nibble<3>(v);
      default: return nibble<0>(v);
    }
  }
  // Group g (of 128) of 4 rows from w, one row of x, for one_row_groups (blocking.h): each row's 64 bytes
  // loaded once, its four nibbles in turn, as block's steps u = 0..3 (fewer loads than block<1, 4>).
  void group_dot(const uint8_t* w, int64_t row_bytes, int64_t g, Acc* acc) const {
    const int16_t* xg = x + 128 * g;
    const __m512i x0 = _mm512_loadu_si512(xg), x1 = _mm512_loadu_si512(xg + 32), x2 = _mm512_loadu_si512(xg + 64),
                  x3 = _mm512_loadu_si512(xg + 96);
    for (int r = 0; r < 4; ++r) {
      const __m512i v = _mm512_loadu_si512(w + r * row_bytes + 64 * g);
      acc[r] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), nibble<0>(v), x0);
      acc[r] = _mm512_dpwssd_epi32(acc[r], nibble<1>(v), x1);
      acc[r] = _mm512_dpwssd_epi32(acc[r], nibble<2>(v), x2);
      acc[r] = _mm512_dpwssd_epi32(acc[r], nibble<3>(v), x3);
    }
  }
};

// The split formats (w6a16, w5a16; api.h's layout): W4A16's 64 bytes of low nibbles, then a plane of the high
// bits. Step u (values 32u..32u+31, lane j value 32u + j) ORs the low nibble u with its high bits at bit 4.
//
// The high plane is read so that every step finds its bits in the same place of every lane, shifted once:
//   w6a16: 32 bytes, lane i (of 16) holding values i + 16s in its field s (2 bits). Lane j of step u is value
//     16(2u + h) + j % 16 (h = j / 16): field 2u + h. The plane goes to both 256-bit halves, the upper one
//     shifted down by 2 (one VPSRLVW), so every lane's field for step u sits at bits 4u, 4u + 1.
//   w5a16: 16 bytes, lane i (of 8) holding values i + 8t in its bit t. Lane j of step u is value 32u + j: bit
//     4u + q (q = j / 8) of plane lane j % 8. The plane goes to all four 128-bit blocks, block q shifted down by
//     q (one VPSRLVW), so every lane's bit for step u sits at bit 4u.
// Step u then moves bit 4u to bit 4 by a constant shift, and one VPTERNLOGD takes the high bits under the mask
// (0x30 or 0x10) and the nibble elsewhere: a value below 64, so VPDPWSSD's pairs (|q x| <= 63 * 32767) never
// overflow.
template <int B>
inline __m512i high_plane(const uint8_t* p) {
  if constexpr (B == 6) {
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_srlv_epi16(v, _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1));
  } else {
    static_assert(B == 5, "split formats: 5 or 6 bits");
    const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_srlv_epi16(v, _mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
                                                 0x0002000200020002, 0x0001000100010001, 0x0001000100010001, 0, 0));
  }
}

template <int B, int u>
inline __m512i split_step(__m512i low, __m512i high) {
  constexpr int mask = B == 6 ? 0x30 : 0x10;
  __m512i moved = high;  // bit 4u to bit 4
  if constexpr (u == 0) moved = _mm512_slli_epi16(high, 4);
  else if constexpr (u > 1) moved = _mm512_srli_epi16(high, 4 * u - 4);
  return _mm512_ternarylogic_epi32(_mm512_set1_epi16(mask), moved, nibble<u>(low), 0xCA);  // mask ? moved : nibble
}

template <int B>
struct Split : Grouped<B> {
  using V = __m512i; using State = float;
  // All four steps of the 128 values at b (their planes read once): the decode step's group and the unpacking.
  static void steps(const uint8_t* b, __m512i* q) {
    const __m512i low = _mm512_loadu_si512(b), high = high_plane<B>(b + 64);
    q[0] = split_step<B, 0>(low, high);
    q[1] = split_step<B, 1>(low, high);
    q[2] = split_step<B, 2>(low, high);
    q[3] = split_step<B, 3>(low, high);
  }
  V wv(const State&, int64_t n, int64_t k, int u) const {
    const uint8_t* b = this->at(n, k);
    const __m512i low = _mm512_loadu_si512(b), high = high_plane<B>(b + 64);
    switch (u) {
      case 1: return split_step<B, 1>(low, high);
      case 2: return split_step<B, 2>(low, high);
      case 3: return split_step<B, 3>(low, high);
      default: return split_step<B, 0>(low, high);
    }
  }
  // one_row_groups' group g of 4 rows (blocking.h): each row's planes loaded once, block's steps u = 0..3 in turn.
  void group_dot(const uint8_t* w, int64_t row_bytes, int64_t g, __m512i* acc) const {
    const int16_t* xg = this->x + 128 * g;
    const uint8_t* group = w + 16 * B * g;
    const __m512i x0 = _mm512_loadu_si512(xg), x1 = _mm512_loadu_si512(xg + 32), x2 = _mm512_loadu_si512(xg + 64),
                  x3 = _mm512_loadu_si512(xg + 96);
    for (int r = 0; r < 4; ++r) {
      __m512i q[4];
      steps(group + r * row_bytes, q);
      acc[r] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q[0], x0);
      acc[r] = _mm512_dpwssd_epi32(acc[r], q[1], x1);
      acc[r] = _mm512_dpwssd_epi32(acc[r], q[2], x2);
      acc[r] = _mm512_dpwssd_epi32(acc[r], q[3], x3);
    }
  }
};
using W6A16 = Split<6>;
using W5A16 = Split<5>;

// w4a8: the nibbles as unsigned bytes (0..15) against int8 x (VPDPBUSD, 64 MACs per instruction), x laid out by
// quantize_x8_w4 (common.h) so that a 64-byte load's low nibbles meet x bytes 0..63 of the block and its high
// nibbles x bytes 64..127: per 128 weights two dot products and three masks or shifts, where w4a16 takes four
// dot products and six. No offset to undo: the weights are the unsigned operand, x the signed one.
struct W4A8 {
  using Acc = __m512i; using V = __m512i; using Sum = __m512; using State = float;
  static constexpr int kStep = 64, kSub = 2, kBits = 4; static constexpr bool kFolds = true;
  const int8_t* x; int64_t K; const float* x_scale;
  const uint8_t* w; const float* scale; const float* offset; const float* x_group; int64_t group;
  static Sum sum_zero() { return _mm512_setzero_ps(); }
  static Acc zero() { return _mm512_setzero_si512(); }
  int64_t span() const { return group; }
  State begin(int64_t n, int64_t k) const { return scale[n * (K / group) + k / group]; }
  const void* at(int64_t n, int64_t k) const { return w + n * (K / 2) + k / 2; }
  V wv(const State&, int64_t n, int64_t k, int u) const {
    const __m512i v = _mm512_loadu_si512(at(n, k)), low = _mm512_set1_epi8(0xF);
    return _mm512_and_si512(u == 0 ? v : _mm512_srli_epi16(v, 4), low);
  }
  V xv(int m, int64_t k) const { return _mm512_loadu_si512(x + m * K + k); }
  static Acc madd(Acc a, V w, V x) { return _mm512_dpbusd_epi32(a, w, x); }
  static __m512 fold(__m512 sum, Acc a, const State& s) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(s), sum);
  }
  // one_row_groups' group g of 4 rows (blocking.h), in block's order of steps: each row's 64 bytes loaded once.
  void group_dot(const uint8_t* w, int64_t row_bytes, int64_t g, Acc* acc) const {
    const int8_t* xg = x + 128 * g;
    const __m512i low = _mm512_set1_epi8(0xF), x0 = _mm512_loadu_si512(xg), x1 = _mm512_loadu_si512(xg + 64);
    for (int r = 0; r < 4; ++r) {
      const __m512i v = _mm512_loadu_si512(w + r * row_bytes + 64 * g);
      acc[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, low), x0);
      acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_and_si512(_mm512_srli_epi16(v, 4), low), x1);
    }
  }
  __m128 finish(__m128 sums, int64_t n, int m, int lanes) const {
    return int4_finish(sums, offset, x_group, K / group, x_scale[m], n, m, lanes);
  }
};

// Four row sums into y (a block's last rows may be fewer: lanes).
inline void put(float* y, __m128 v, int lanes) {
  if (lanes == 4) _mm_storeu_ps(y, v); else _mm_store_ss(y, v);
}

}  // namespace

#include "blocking.h"

namespace {

using namespace qs;

void gemv_f32(const float* x, const float* w, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  gemv(F32{{w, x, K}}, M, N, n0, n1, y);
}
void gemv_bf16(const uint16_t* x, const uint16_t* w, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1,
               float* y) {
  gemv(Bf16{{w, x, K}}, M, N, n0, n1, y);
}

// A row's quantization scale: max|x| (at least `floor`) over the integer range `qmax`. K: a multiple of 16.
inline float simd_row_scale(const float* row, int64_t K, float qmax, float floor) {
  __m512 amax = _mm512_setzero_ps();
  // VMAXPS returns its second operand where a lane is NaN: the running max, so a NaN is skipped as std::fmax
  // skips it in common.h's row_scale
  for (int64_t k = 0; k < K; k += 16) amax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(row + k)), amax);
  return std::max(_mm512_reduce_max_ps(amax), floor) / qmax;
}

// q = round-half-even(x / scale) as common.h's quant8, stored as q + 128 (unsigned, for VPDPBUSD).
void quantize_x8(const float* x, int64_t M, int64_t K, uint8_t* q, float* scales) {
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    const float scale = simd_row_scale(row, K, 127.f, kX8Floor);
    scales[m] = scale;
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t k = 0; k < K; k += 16) {
      __m512i v = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(row + k), s));  // MXCSR: nearest-even
      v = _mm512_add_epi32(_mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127)),
                           _mm512_set1_epi32(128));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + m * K + k), _mm512_cvtepi32_epi8(v));
    }
  }
}

void quantize_x16(const float* x, int64_t M, int64_t K, int64_t group, int16_t* q, float* scales, float* group_sums) {
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    const float scale = simd_row_scale(row, K, 32767.f, kX16Floor);
    scales[m] = scale;
    const __m512 inv = _mm512_set1_ps(1.f / scale);
    __m512i gsum = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 16) {
      __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + k), inv));  // MXCSR: nearest-even
      v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(32767)), _mm512_set1_epi32(-32767));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + m * K + k), _mm512_cvtepi32_epi16(v));
      if (group > 0) {
        gsum = _mm512_add_epi32(gsum, v);
        if ((k + 16) % group == 0) {
          group_sums[m * (K / group) + k / group] = static_cast<float>(_mm512_reduce_add_epi32(gsum));
          gsum = _mm512_setzero_si512();
        }
      }
    }
  }
}

// common.h's quantize_x8_bf16, 16 at a time: q = round-half-even(x / scale) clamped to 127, then as bf16, which
// holds an integer of |q| <= 127 exactly in its upper 16 bits. K: a multiple of 16.
void quantize_x8_bf16_simd(const uint16_t* x, int64_t K, int64_t r0, int64_t r1, uint16_t* q, float* x_scale) {
  auto load = [](const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  };
  for (int64_t m = r0; m < r1; ++m) {
    const uint16_t* row = x + m * K;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load(row + k)));
    const float scale = std::max(_mm512_reduce_max_ps(amax), kX8Floor) / 127.f;
    x_scale[m] = scale;
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t k = 0; k < K; k += 16) {
      __m512i v = _mm512_cvtps_epi32(_mm512_div_ps(load(row + k), s));  // MXCSR: nearest-even
      v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
      const __m512i b = _mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(v)), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + m * K + k), _mm512_cvtepi32_epi16(b));
    }
  }
}

void gemv_w8a8(const uint8_t* xq, const float* x_scale, const int8_t* w, const float* w_scale, const int32_t* w_sum,
               int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  gemv(W8A8{{w, xq, K}, w_scale, w_sum, x_scale}, M, N, n0, n1, y);
}

void gemv_w8a16(const int16_t* xq, const float* x_scale, const int8_t* w, const float* w_scale, int64_t M, int64_t K,
                int64_t N, int64_t n0, int64_t n1, float* y) {
  if (K % 64 != 0) return gemv(W8A16{{xq, K, x_scale}, w, w_scale}, M, N, n0, n1, y);  // K = 32 mod 64
  thread_local std::vector<int16_t> paired;
  if (static_cast<int64_t>(paired.size()) < M * K) paired.resize(M * K);
  pair_x(xq, M, K, paired.data());
  gemv(W8A16Pairs{{paired.data(), K, x_scale}, w, w_scale}, M, N, n0, n1, y);
}




void gemv_w4a8(const int8_t* xq, const float* x_scale, const float* group_sums, const uint8_t* w, const float* scale,
               const float* offset, int64_t group, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  gemv(W4A8{xq, K, x_scale, w, scale, offset, group_sums, group}, M, N, n0, n1, y);
}

void dequant_w4a16(const uint8_t* w, const float* scale, const float* offset, int64_t group, int64_t K, int64_t n0,
                   int64_t n1, uint16_t* o) {
  const W4Unpack f{w, K, scale, offset, group};
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k0 = 0; k0 < K; k0 += group) {
      const __m512i table = f.table(n, k0);
      for (int64_t k = k0; k < k0 + group; k += 128)
        for (int u = 0; u < 4; ++u) _mm512_storeu_si512(o + n * K + k + 32 * u, f.bf16(table, n, k, u));
    }
}

// fp32 to bf16 bits, 16 at a time, as common.h's f32_to_bf16: rounded to nearest even, a NaN as 0x7FC0 (integer
// arithmetic, not VCVTNEPS2BF16, which flushes a denormal to zero where the reference keeps it).
inline __m512i bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
}

// The split formats' prefill unpacking: the 32 values of each step as the decode step reads them (Split::steps, the
// planes read once per 128), widened to fp32, q * scale + offset in one FMA (as the reference's std::fma), rounded
// to bf16.
template <typename F>
void dequant_split(const uint8_t* w, const float* scale, const float* offset, int64_t group, int64_t K, int64_t n0,
                   int64_t n1, uint16_t* o) {
  const int64_t G = K / group;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k = 0; k < K; k += 128) {
      const __m512 s = _mm512_set1_ps(scale[n * G + k / group]), z = _mm512_set1_ps(offset[n * G + k / group]);
      __m512i q[4];
      F::steps(w + (n * K + k) * F::kBits / 8, q);
      for (int u = 0; u < 4; ++u)
        for (int h = 0; h < 2; ++h) {
          const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(q[u], h)));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + n * K + k + 32 * u + 16 * h),
                              _mm512_cvtepi32_epi16(bf16_bits(_mm512_fmadd_ps(v, s, z))));
        }
    }
}

// --- attention for a few queries: each query row on its own, in a fixed order ------------------------
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// e^x for x <= 0 (scores less their maximum), 16 at a time: Cephes' expf polynomial (within 2 ulp) and
// a scale by 2^n. std::exp one score at a time was most of a step's attention at 4000 tokens of context.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// DB = head dim / 16: the query and the output row stay in DB registers each. Every step below depends
// only on the query's own position (n), never on how many queries came together.
template <int DB, typename T>
void attend(const T* q, const T* k, const T* v, int64_t head_stride, T* out, int64_t H, int64_t KVH, int64_t Q,
            int64_t L, float scale, int64_t i0, int64_t i1) {
  constexpr int64_t D = DB * 16;
  const int64_t group = H / KVH;
  std::vector<float> scores(L + 16);
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t h = item / Q, i = item % Q, n = L - Q + i + 1;
    const T* kh = k + (h / group) * head_stride;
    const T* vh = v + (h / group) * head_stride;
    __m512 qv[DB];
    for (int d = 0; d < DB; ++d) qv[d] = load16(q + item * D + 16 * d);
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {   // four keys at a time
      __m512 s[4];
      for (int r = 0; r < 4; ++r) {
        s[r] = _mm512_mul_ps(qv[0], load16(kh + (j + r) * D));
        for (int d = 1; d < DB; ++d) s[r] = _mm512_fmadd_ps(qv[d], load16(kh + (j + r) * D + 16 * d), s[r]);
      }
      _mm_storeu_ps(&scores[j], _mm_mul_ps(sum4(s), _mm_set1_ps(scale)));
    }
    for (; j < n; ++j) {
      __m512 s = _mm512_mul_ps(qv[0], load16(kh + j * D));
      for (int d = 1; d < DB; ++d) s = _mm512_fmadd_ps(qv[d], load16(kh + j * D + 16 * d), s);
      scores[j] = _mm512_reduce_add_ps(s) * scale;
    }
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (j = 0; j < n; j += 16) {
      const __mmask16 m = n - j >= 16 ? 0xFFFF : (1 << (n - j)) - 1;
      top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, &scores[j]));
    }
    const __m512 best = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (j = 0; j < n; j += 16) {
      const __mmask16 m = n - j >= 16 ? 0xFFFF : (1 << (n - j)) - 1;
      const __m512 p = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, &scores[j]), best)));
      _mm512_mask_storeu_ps(&scores[j], m, p);
      sum = _mm512_add_ps(sum, p);
    }
    const __m512 total = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
    __m512 acc[DB];
    for (int d = 0; d < DB; ++d) acc[d] = _mm512_setzero_ps();
    for (j = 0; j < n; ++j) {   // each value row once, into DB accumulators
      const __m512 p = _mm512_set1_ps(scores[j]);
      for (int d = 0; d < DB; ++d) acc[d] = _mm512_fmadd_ps(p, load16(vh + j * D + 16 * d), acc[d]);
    }
    alignas(64) float row[16];
    for (int d = 0; d < DB; ++d) {
      _mm512_store_ps(row, _mm512_div_ps(acc[d], total));
      for (int l = 0; l < 16; ++l) store(out + item * D + 16 * d, l, row[l]);
    }
  }
}

template <typename T>
void attention(const T* q, const T* k, const T* v, int64_t hs, int64_t H, int64_t KVH, int64_t Q, int64_t L, int64_t D,
               float scale, int64_t i0, int64_t i1, T* out) {
  switch (D) {  // the head dims of the models quantspec runs (tiny ones included); the binding checks D
    case 16: attend<1>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    case 32: attend<2>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    case 64: attend<4>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    case 128: attend<8>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    default: attend<16>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
  }
}

// gemm_bf16 (api.h): c += A B in tiles of MR rows x 32 columns held in 2 * MR accumulators over a run of KC pairs,
// each step one VDPBF16PS per accumulator with A's pair broadcast. A block of MC rows' A (MC x KC pairs, 256 KB)
// stays in L2 while every panel of B (KC x 32 pairs, 64 KB) is read once from memory and by each of the block's
// tiles from L2: an 11008-wide Gram of 4096 rows streams B ~4 GB in all, C ~2 GB.
constexpr int64_t GEMM_MR = 8, GEMM_KC = 512, GEMM_MC = 128;

template <int MR>
void gemm_tile(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t k0, int64_t k1, __mmask16 lo,
               __mmask16 hi, float* c, int64_t ldc) {
  __m512 acc[MR][2];
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = _mm512_maskz_loadu_ps(lo, c + r * ldc);
    acc[r][1] = _mm512_maskz_loadu_ps(hi, c + r * ldc + 16);
  }
  for (int64_t k = k0; k < k1; ++k) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + 32 * k), b1 = (__m512bh)_mm512_loadu_si512(b + 32 * k + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(int(a[r * lda + k]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, lo, acc[r][0]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, hi, acc[r][1]);
  }
}

void gemm_bf16(const uint32_t* a, int64_t lda, const uint32_t* bp, int64_t K2, int64_t N, int64_t m0, int64_t m1,
               int upper, float* c, int64_t ldc) {
  const int64_t panels = (N + 31) / 32;
  for (int64_t k0 = 0; k0 < K2; k0 += GEMM_KC) {
    const int64_t k1 = std::min(K2, k0 + GEMM_KC);
    for (int64_t b0 = m0; b0 < m1; b0 += GEMM_MC) {
      const int64_t b1 = std::min(m1, b0 + GEMM_MC);
      for (int64_t p = upper ? b0 / 32 : 0; p < panels; ++p) {  // the panels some row of the block needs
        const int64_t j0 = 32 * p, width = std::min<int64_t>(32, N - j0);
        const __mmask16 lo = width >= 16 ? 0xFFFF : __mmask16((1u << width) - 1);
        const __mmask16 hi = width >= 32 ? 0xFFFF : width <= 16 ? 0 : __mmask16((1u << (width - 16)) - 1);
        const uint32_t* b = bp + p * K2 * 32;
        for (int64_t r = b0; r < b1; r += GEMM_MR) {
          const int64_t rows = std::min(GEMM_MR, b1 - r);
          if (upper && j0 + 31 < r) continue;  // the tile's rows need none of this panel
          const uint32_t* ar = a + r * lda;
          float* cr = c + r * ldc + j0;
          if (rows == GEMM_MR) gemm_tile<GEMM_MR>(ar, lda, b, k0, k1, lo, hi, cr, ldc);
          else
            for (int64_t i = 0; i < rows; ++i) gemm_tile<1>(ar + i * lda, lda, b, k0, k1, lo, hi, cr + i * ldc, ldc);
        }
      }
    }
  }
}

// --- many rows on int8 activations (api.h's gemm_grouped_x8: a prefill's GEMM) ----------------------------
// The gemv's layout (a row's values along a register, summed across it at the end) folds every integer sum into
// fp32 once per group: two VPDPBUSD per fold at int8. For many rows the weights are laid out the GEMM's way
// instead: a panel of 32 output columns is unpacked once per call into bytes where each 64-byte vector holds one
// quad (4 consecutive k) of 16 columns, lane c column c, and every row of x meets it with its quad broadcast
// (one VPDPBUSD per 64 multiply-adds of 16 columns, a fold per 32 of them). The panel (32 bytes per k: 128 KB at
// K = 4096, 344 KB at 11008) stays in L2 while every row of x streams past it; unpacking it costs ~1/8 of an
// instruction per weight, once, against the rows' 1/64 each.
constexpr int64_t X8_NR = 32;  // columns per panel: two vectors of 16

// Chunk b (128 values) of a B-bit row as 4 int16 vectors, q[u] lane j = value 32u + j (the decode step's steps).
template <int B>
inline void chunk_values(const uint8_t* b, __m512i* q) {
  if constexpr (B == 4) {
    const __m512i v = _mm512_loadu_si512(b);
    q[0] = nibble<0>(v), q[1] = nibble<1>(v), q[2] = nibble<2>(v), q[3] = nibble<3>(v);
  } else {
    Split<B>::steps(b, q);
  }
}

// Where the packed bytes put each quad: VPACKUSWB packs within 128-bit lanes, so dword 4L + t of pack(q[0], q[1])
// is quad 2L + t (t < 2) or 8 + 2L + t - 2 (from q[1]); pack(q[2], q[3]) likewise, 16 quads on. x's quad is read
// from its place, so the weights need no reordering.
constexpr int x8_quad(int pos) {
  const int L = (pos % 16) / 4, t = pos % 4;
  return (pos / 16) * 16 + (t < 2 ? 2 * L + t : 8 + 2 * L + t - 2);
}

// r[c] (column c's 16 dwords) to out[p] (dword p of every column, lane c): 32-bit, then 64-bit interleaves, then
// a 4 x 4 transpose of 128-bit lanes; 64 shuffles.
inline void transpose16(const __m512i* r, __m512i* out) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // b[4i + t] lane L: columns 4i..4i+3 at dword 4L + t
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int t = 0; t < 4; ++t) {
    const __m512i c0 = _mm512_shuffle_i32x4(b[t], b[4 + t], 0x44), c1 = _mm512_shuffle_i32x4(b[t], b[4 + t], 0xEE);
    const __m512i c2 = _mm512_shuffle_i32x4(b[8 + t], b[12 + t], 0x44), c3 = _mm512_shuffle_i32x4(b[8 + t], b[12 + t], 0xEE);
    out[t] = _mm512_shuffle_i32x4(c0, c2, 0x88);
    out[4 + t] = _mm512_shuffle_i32x4(c0, c2, 0xDD);
    out[8 + t] = _mm512_shuffle_i32x4(c1, c3, 0x88);
    out[12 + t] = _mm512_shuffle_i32x4(c1, c3, 0xDD);
  }
}

// Columns n..n + 32 (those below N; the rest zero) as the panel [K / 128][32 quads][2 halves] of vectors, and their
// scales and offsets as [G][32].
template <int B>
void x8_pack(const uint8_t* w, const float* scale, const float* offset, int64_t group, int64_t K, int64_t N, int64_t n,
             __m512i* panel, float* sc, float* of) {
  const int64_t chunks = K / 128, G = K / group, row_bytes = K * B / 8;
  for (int64_t c = 0; c < chunks; ++c)
    for (int h = 0; h < 2; ++h) {
      __m512i lo[16], hi[16];
      for (int j = 0; j < 16; ++j) {
        const int64_t row = n + 16 * h + j;
        if (row >= N) { lo[j] = hi[j] = _mm512_setzero_si512(); continue; }
        __m512i q[4];
        chunk_values<B>(w + row * row_bytes + c * 16 * B, q);
        lo[j] = _mm512_packus_epi16(q[0], q[1]);
        hi[j] = _mm512_packus_epi16(q[2], q[3]);
      }
      __m512i t[16];
      transpose16(lo, t);
      for (int p = 0; p < 16; ++p) panel[(c * 32 + p) * 2 + h] = t[p];
      transpose16(hi, t);
      for (int p = 0; p < 16; ++p) panel[(c * 32 + 16 + p) * 2 + h] = t[p];
    }
  x8_panel_scales(scale, offset, G, N, n, X8_NR, sc, of);
}

inline __m512i x8_broadcast(const int8_t* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// MR rows of x from xm against one packed panel: integer sums per block in registers, folded into fp32 sums as
// api.h orders it; y's columns n.. (lanes past N masked off).
template <int MR>
void x8_tile(const __m512i* panel, const float* sc, const float* of, const int8_t* xm, const float* xs, const float* xo,
             int64_t K, int64_t group, float* y, int64_t N, int64_t n, __mmask16 lo, __mmask16 hi) {
  const int64_t chunks = K / 128, per_group = group / 128;
  __m512 f[MR][2];
  for (int m = 0; m < MR; ++m) f[m][0] = f[m][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i a[MR][2];
    for (int m = 0; m < MR; ++m) a[m][0] = a[m][1] = _mm512_setzero_si512();
    const __m512i* pc = panel + c * 64;
    const int8_t* xc = xm + c * 128;
#pragma GCC unroll 32
    for (int p = 0; p < 32; ++p) {
      const __m512i w0 = _mm512_load_si512(pc + 2 * p), w1 = _mm512_load_si512(pc + 2 * p + 1);
      for (int m = 0; m < MR; ++m) {
        const __m512i xb = x8_broadcast(xc + m * K + 4 * x8_quad(p));
        a[m][0] = _mm512_dpbusd_epi32(a[m][0], w0, xb);
        a[m][1] = _mm512_dpbusd_epi32(a[m][1], w1, xb);
      }
    }
    const int64_t g = c / per_group;
    const __m512 s0 = _mm512_loadu_ps(sc + g * X8_NR), s1 = _mm512_loadu_ps(sc + g * X8_NR + 16);
    const __m512 o0 = _mm512_loadu_ps(of + g * X8_NR), o1 = _mm512_loadu_ps(of + g * X8_NR + 16);
    for (int m = 0; m < MR; ++m) {
      const __m512 sx = _mm512_set1_ps(xs[m * chunks + c]), xov = _mm512_set1_ps(xo[m * chunks + c]);
      f[m][0] = _mm512_fmadd_ps(o0, xov, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[m][0]), _mm512_mul_ps(s0, sx), f[m][0]));
      f[m][1] = _mm512_fmadd_ps(o1, xov, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[m][1]), _mm512_mul_ps(s1, sx), f[m][1]));
    }
  }
  for (int m = 0; m < MR; ++m) {
    _mm512_mask_storeu_ps(y + m * N + n, lo, f[m][0]);
    _mm512_mask_storeu_ps(y + m * N + n + 16, hi, f[m][1]);
  }
}

constexpr int X8_MR = 4;  // rows a tile: 8 integer and 8 float sums, 2 weights, 4 scales in 32 registers

template <int B>
void gemm_grouped_x8(const int8_t* xq, const float* xs, const float* xo, const uint8_t* w, const float* scale,
                     const float* offset, int64_t group, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1,
                     float* y) {
  const int64_t chunks = K / 128, G = K / group;
  thread_local std::vector<__m512i> panel;  // C++17: allocated at the vector type's 64-byte alignment
  thread_local std::vector<float> sc, of;
  panel.resize(chunks * 64);
  sc.resize(G * X8_NR);
  of.resize(G * X8_NR);
  for (int64_t n = n0; n < n1; n += X8_NR) {
    const int64_t width = std::min<int64_t>(X8_NR, n1 - n);
    const __mmask16 lo = width >= 16 ? 0xFFFF : __mmask16((1u << width) - 1);
    const __mmask16 hi = width >= 32 ? 0xFFFF : width <= 16 ? 0 : __mmask16((1u << (width - 16)) - 1);
    x8_pack<B>(w, scale, offset, group, K, n1, n, panel.data(), sc.data(), of.data());
    int64_t m = 0;
    for (; m + X8_MR <= M; m += X8_MR)
      x8_tile<X8_MR>(panel.data(), sc.data(), of.data(), xq + m * K, xs + m * chunks, xo + m * chunks, K, group,
                     y + m * N, N, n, lo, hi);
    for (; m < M; ++m)
      x8_tile<1>(panel.data(), sc.data(), of.data(), xq + m * K, xs + m * chunks, xo + m * chunks, K, group, y + m * N,
                 N, n, lo, hi);
  }
}

// common.h's quantize_x8_blocks, 16 at a time (the same divisions and roundings).
void quantize_x8_blocks_simd(const uint16_t* x, int64_t K, int64_t r0, int64_t r1, int8_t* q, float* xs, float* xo) {
  auto load = [](const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  };
  const int64_t blocks = K / 128;
  for (int64_t m = r0; m < r1; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      const uint16_t* in = x + m * K + 128 * b;
      __m512 amax = _mm512_setzero_ps();
      for (int k = 0; k < 128; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load(in + k)));
      const float scale = std::max(_mm512_reduce_max_ps(amax), kX8Floor) / 127.f;
      const __m512 s = _mm512_set1_ps(scale);
      __m512i sum = _mm512_setzero_si512();
      for (int k = 0; k < 128; k += 16) {
        __m512i v = _mm512_cvtps_epi32(_mm512_div_ps(load(in + k), s));  // MXCSR: nearest-even
        v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
        sum = _mm512_add_epi32(sum, v);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + m * K + 128 * b + k), _mm512_cvtepi32_epi8(v));
      }
      xs[m * blocks + b] = scale;
      xo[m * blocks + b] = scale * float(_mm512_reduce_add_epi32(sum));
    }
}

// Grouped formats without an entry here (w2a16) run the best kernel of a variant below that the CPU runs (api.h).
const qs_kernels table = [] {
  qs_kernels t = {QS_ABI, "avx512", 1, gemv_f32, gemv_bf16, quantize_x8, gemv_w8a8, quantize_x16, gemv_w8a16,
                  quantize_x8_w4, gemv_w4a8, quantize_x8_bf16_simd, scale_rows_bf16, rms_norm<float>, rms_norm<uint16_t>,
                  attention<float>, attention<uint16_t>};
  t.gemv_grouped[QS_W4A16] = grouped_gemv<W4A16>;
  t.dequant_grouped[QS_W4A16] = dequant_w4a16;
  t.gemv_grouped[QS_W6A16] = grouped_gemv<W6A16>;
  t.dequant_grouped[QS_W6A16] = dequant_split<W6A16>;
  t.gemv_grouped[QS_W5A16] = grouped_gemv<W5A16>;
  t.dequant_grouped[QS_W5A16] = dequant_split<W5A16>;
  t.gemm_bf16 = gemm_bf16;
  t.quantize_x8_blocks = quantize_x8_blocks_simd;
  t.gemm_grouped_x8[QS_W4A16] = gemm_grouped_x8<4>;
  t.gemm_grouped_x8[QS_W6A16] = gemm_grouped_x8<6>;
  t.gemm_grouped_x8[QS_W5A16] = gemm_grouped_x8<5>;
  return t;
}();

}  // namespace

extern "C" const qs_kernels* qs_kernels_get(void) { return &table; }
