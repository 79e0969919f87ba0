// The AVX2 variant (AVX2, FMA, F16C): most x86-64 CPUs without AVX-512 (Intel since Haswell, 12th-gen
// and later laptops and desktops, AMD before Zen 4). The same blocking as avx512.cpp at 256 bits: 4 weight
// rows at a time, every weight register used for up to 2 rows of x (16 registers: 8 accumulators, 4
// weights, x and temporaries), W read once per 2 rows from memory and again from cache.
//
// AVX2 has no bf16 or byte dot product with 32-bit accumulation:
//   bf16    the weights widened to fp32 (a shift of the zero-extended bits) and FMA;
//   w8a8    VPMADDUBSW (u8 x s8 pairs into saturating int16) on |x| and w carrying x's sign (VPSIGNB):
//           |products| <= 127 * 127, so a pair never saturates (an unsigned x + 128 would), then
//           VPMADDWD by ones into int32;
//   w8a16   int8 weights split into int16 by shifts (even- and odd-indexed apart, x paired to match),
//           VPMADDWD with the int16 activations; the int32 lanes folded into fp32 every 2048 values
//           (2 * 127 * 32767 per lane per step, 128 steps < 2^31);
//   w4a16   the nibbles as int16 by a shift and a mask, VPMADDWD, each group's sum scaled in fp32.
//
// Compiled with -mavxvnni this file is the avx_vnni variant (Alder Lake and later Intel clients, Zen 5
// laptops without AVX-512): AVX-VNNI's VEX VPDPBUSD takes w8a8's products and sums into int32 in one
// instruction (x stored as q + 128, unsigned, the offset undone with the weights' row sums as in
// avx512.cpp), and VPDPWSSD replaces VPMADDWD + VPADDD in the 16-bit formats. Everything else is AVX2's.
// QS_VNNI_EVEX builds the same code with AVX512-VNNI's EVEX encoding of both instructions (same results,
// lane for lane): no emulator here runs AVX-VNNI, so the tests run this twin on AVX-512 VNNI hosts.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "api.h"
#include "common.h"

#if defined(__AVXVNNI__)
#define QS_VNNI 1
#define QS_DPBUSD _mm256_dpbusd_avx_epi32
#define QS_DPWSSD _mm256_dpwssd_avx_epi32
#define QS_NAME "avx_vnni"
#elif defined(QS_VNNI_EVEX)
#define QS_VNNI 1
#define QS_DPBUSD _mm256_dpbusd_epi32
#define QS_DPWSSD _mm256_dpwssd_epi32
#define QS_NAME "avx_vnni_evex"
#else
#define QS_VNNI 0
#define QS_NAME "avx2"
#endif

namespace {

using namespace qs;

constexpr int kRows = 4;   // weight rows per block
constexpr int kMaxM = 2;   // x rows per pass: 2 x 4 accumulators + 4 weights + x + temporaries fit in 16

// Four sums at once (lane i: the sum of a[i]'s 8 lanes).
inline __m128 sum4(const __m256* a) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}
inline __m128i sum4(const __m256i* a) {
  const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}
inline float hsum(__m256 a) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
inline float hmax(__m256 a) {  // the largest of 8 lanes, by MAXPS (callers that skip NaN keep it out of a)
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
inline __m128 sum1(__m256 a) { return _mm_set_ss(hsum(a)); }
inline __m128i sum1(__m256i a) {
  const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  const __m128i q = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  return _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xB1));
}

// Integer adds are associative, so GCC regroups a block's unrolled accumulations into trees of products
// computed first and spilled to the stack (64 spills a step in w4a16's block); an empty asm on each
// sum keeps it one register, added in order.
inline __m256i keep(__m256i a) {
  asm("" : "+x"(a));
  return a;
}

inline __m256 widen_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

struct NoState {};

template <typename W, typename X>
struct Dense {
  using State = NoState;
  static constexpr int kSub = 1;
  const W* w; const X* x; int64_t K;
  int64_t span() const { return K; }
  State begin(int64_t, int64_t) const { return {}; }
  const W* at(int64_t n, int64_t k) const { return w + n * K + k; }
  const X* x_at(int m, int64_t k) const { return x + m * K + k; }
  __m128 finish(__m128 sums, int64_t, int, int) const { return sums; }
};

struct F32 : Dense<float, float> {
  using Acc = __m256; using V = __m256; static constexpr int kStep = 8;
  using Sum = Acc; static Sum sum_zero() { return zero(); }
  V wv(const State&, int64_t n, int64_t k) const { return _mm256_loadu_ps(at(n, k)); }
  V xv(int m, int64_t k) const { return _mm256_loadu_ps(x_at(m, k)); }
  static Acc zero() { return _mm256_setzero_ps(); }
  static Acc madd(Acc a, V w, V x) { return _mm256_fmadd_ps(w, x, a); }
};

// x and the weights widened to fp32 as they are loaded (bf16 is exact in fp32): no copy of x per call.
struct Bf16 : Dense<uint16_t, uint16_t> {
  using Acc = __m256; using V = __m256; static constexpr int kStep = 8;
  using Sum = Acc; static Sum sum_zero() { return zero(); }
  V wv(const State&, int64_t n, int64_t k) const { return widen_bf16(at(n, k)); }
  V xv(int m, int64_t k) const { return widen_bf16(x_at(m, k)); }
  static Acc zero() { return _mm256_setzero_ps(); }
  static Acc madd(Acc a, V w, V x) { return _mm256_fmadd_ps(w, x, a); }
};

struct W8A8 : Dense<int8_t, int8_t> {  // 32 per step
  using Acc = __m256i; using V = __m256i; static constexpr int kStep = 32;
  using Sum = Acc; static Sum sum_zero() { return zero(); }
  const float* w_scale; const int32_t* w_sum; const float* x_scale;
  V wv(const State&, int64_t n, int64_t k) const { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(n, k))); }
  V xv(int m, int64_t k) const { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_at(m, k))); }
  static Acc zero() { return _mm256_setzero_si256(); }
#if QS_VNNI
  static Acc madd(Acc a, V w, V x) { return QS_DPBUSD(a, x, w); }   // x holds q + 128
#else
  static Acc madd(Acc a, V w, V x) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));
    return keep(_mm256_add_epi32(a, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))));
  }
#endif
  __m128 finish(__m128i sums, int64_t n, int m, int lanes) const {
    alignas(16) float ws[4] = {0, 0, 0, 0};
    alignas(16) int32_t offset[4] = {0, 0, 0, 0};
    for (int i = 0; i < lanes; ++i) {
      ws[i] = w_scale[n + i];
      if (QS_VNNI) offset[i] = w_sum[n + i] * 128;   // sum (q + 128) w = sum q w + 128 sum w
    }
    sums = _mm_sub_epi32(sums, _mm_load_si128(reinterpret_cast<const __m128i*>(offset)));
    return _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(sums), _mm_load_ps(ws)), _mm_set1_ps(x_scale[m]));
  }
};

struct Int16X {
  using Acc = __m256i; using V = __m256i; static constexpr int kStep = 16; static constexpr bool kFolds = true;
  using Sum = __m256; static Sum sum_zero() { return _mm256_setzero_ps(); }
  const int16_t* x; int64_t K; const float* x_scale;
  V xv(int m, int64_t k) const { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + m * K + k)); }
  static Acc zero() { return _mm256_setzero_si256(); }
#if QS_VNNI
  static Acc madd(Acc a, V w, V x) { return QS_DPWSSD(a, w, x); }
#else
  static Acc madd(Acc a, V w, V x) { return keep(_mm256_add_epi32(a, _mm256_madd_epi16(w, x))); }
#endif
};

// int8 weights read 32 at a time and split in place by shifts (as the AVX-512 variant's W8A16Pairs: the even-
// indexed weight of each 16-bit lane in its low byte, the odd in its high), against x split alike
// (pair_x): no lane-crossing sign extension (VPMOVSXBW) per 16 weights.
struct W8A16Pairs : Int16X {
  using State = NoState; static constexpr int kSub = 2;
  const int8_t* w; const float* w_scale;
  int64_t span() const { return std::min<int64_t>(K, 2048); }
  State begin(int64_t, int64_t) const { return {}; }
  const int8_t* at(int64_t n, int64_t k) const { return w + n * K + k; }
  V wv(const State&, int64_t n, int64_t k, int u) const {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(n, k)));
    return u == 0 ? _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8) : _mm256_srai_epi16(v, 8);
  }
  static __m256 fold(__m256 sum, Acc a, const State&) { return _mm256_add_ps(sum, _mm256_cvtepi32_ps(a)); }
  __m128 finish(__m128 sums, int64_t n, int m, int lanes) const {
    alignas(16) float ws[4] = {0, 0, 0, 0};
    for (int i = 0; i < lanes; ++i) ws[i] = w_scale[n + i];
    return _mm_mul_ps(_mm_mul_ps(sums, _mm_load_ps(ws)), _mm_set1_ps(x_scale[m]));
  }
};

// x [M, K] (K a multiple of 32) -> each 32 values as their 16 even-indexed, then their 16 odd-indexed:
// within each 128-bit lane the evens to its low half, then the halves regrouped.
inline void pair_x(const int16_t* x, int64_t M, int64_t K, int16_t* out) {
  const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12,
                                         13, 2, 3, 6, 7, 10, 11, 14, 15);
  for (int64_t i = 0; i < M * K; i += 32) {
    // each: [evens of its first 8, evens of its last 8 | odds of its first 8, odds of its last 8]
    const __m256i a = _mm256_permute4x64_epi64(
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), split), 0xD8);
    const __m256i b = _mm256_permute4x64_epi64(
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16)), split), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16), _mm256_permute2x128_si256(a, b, 0x31));
  }
}

// An int4 format's last step (w = q * scale + offset per group): the offsets meet x's group sums, then x's scale.
inline __m128 int4_finish(__m128 sums, const float* offset, const float* x_group, int64_t G, float x_scale, int64_t n,
                          int m, int lanes) {
  alignas(16) float off[4] = {0, 0, 0, 0};
  for (int r = 0; r < lanes; ++r) {
    float acc = 0.f;
    for (int64_t g = 0; g < G; ++g) acc = std::fma(offset[(n + r) * G + g], x_group[m * G + g], acc);
    off[r] = acc;
  }
  return _mm_mul_ps(_mm_add_ps(sums, _mm_load_ps(off)), _mm_set1_ps(x_scale));
}

// What every grouped weight-only format of B bits shares (api.h's layout): int16 x, 128 values a load group, each
// group's integer sums folded into fp32 by its scale, the offsets met by x's group sums at the end.
template <int B>
struct Grouped : Int16X {
  using State = float; static constexpr int kSub = 8, kBits = B;
  const uint8_t* w; const float* scale; const float* offset; const float* x_group; int64_t group;
  int64_t span() const { return group; }
  State begin(int64_t n, int64_t k) const { return scale[n * (K / group) + k / group]; }
  const uint8_t* at(int64_t n, int64_t k) const { return w + n * (K * B / 8) + k * B / 8; }
  static __m256 fold(__m256 sum, Acc a, const State& s) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps(s), sum);
  }
  __m128 finish(__m128 sums, int64_t n, int m, int lanes) const {
    return int4_finish(sums, offset, x_group, K / group, x_scale[m], n, m, lanes);
  }
};

// Per 64 bytes (128 values): half h (32 bytes) holds lanes 16h..16h+15, whose nibble u are values
// 32u + 16h + 0..15: step s = 2u + h covers values 16s..16s+15, as x is laid out.
// Step s of a 64-byte plane in W4A16's layout (below): nibble s >> 1 of half s & 1, as 16-bit values.
inline __m256i nibble_step(const uint8_t* plane, int s) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane + 32 * (s & 1)));
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (s >> 1))), _mm256_set1_epi16(0xF));
}

struct W4A16 : Grouped<4> {
  static constexpr int order(int i) { return 2 * (i & 3) + (i >> 2); }   // half 0's steps, then half 1's
  V wv(const State&, int64_t n, int64_t k, int s) const { return nibble_step(at(n, k), s); }
  // Group g (of 128) of 4 rows from w, one row of x, for one_row_groups (blocking.h): block's steps in its
  // order (half 0's four, then half 1's), each half of the 4 rows loaded once (fewer loads than block<1, 4>).
  void group_dot(const uint8_t* w, int64_t row_bytes, int64_t g, Acc* acc) const {
    const int16_t* xg = x + 128 * g;
    const __m256i low = _mm256_set1_epi16(0xF);
    for (int r = 0; r < 4; ++r) acc[r] = zero();
    for (int h = 0; h < 2; ++h) {
      __m256i v[4];
      for (int r = 0; r < 4; ++r) v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * row_bytes + 64 * g + 32 * h));
      for (int u = 0; u < 4; ++u) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 32 * u + 16 * h));
        for (int r = 0; r < 4; ++r) acc[r] = madd(acc[r], _mm256_and_si256(_mm256_srli_epi16(v[r], 4 * u), low), xv);
      }
    }
  }
};

// w2a16 (api.h's grouped layout at 2 bits): per 32 bytes (128 values), 16-bit lane i holds values i + 16u in
// its field u, so step u (a shift by 2u and a mask) covers values 16u..16u+15, as x is laid out: one load per
// 128 weights, then W4A16's VPMADDWD and per-group fold.
struct W2A16 : Grouped<2> {
  V wv(const State&, int64_t n, int64_t k, int s) const {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(n, k)));
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * s)), _mm256_set1_epi16(3));
  }
};

// Calls fn(std::integral_constant<int, i>{}) for i = I...: an unrolled loop whose index is a constant in each
// body, so its shifts take immediates and its first and last steps drop what they do not need.
template <int... I, typename Fn>
inline void unrolled(std::integer_sequence<int, I...>, Fn&& fn) {
  (fn(std::integral_constant<int, I>{}), ...);
}

// Nibble u (0..3) of every 16-bit lane: the lowest needs no shift, the highest no mask.
template <int u>
inline __m256i nibble(__m256i v) {
  if constexpr (u == 3) return _mm256_srli_epi16(v, 12);
  else if constexpr (u == 0) return _mm256_and_si256(v, _mm256_set1_epi16(0xF));
  else return _mm256_and_si256(_mm256_srli_epi16(v, 4 * u), _mm256_set1_epi16(0xF));
}

// w6a16's high plane at step s: field s (bits 2s, 2s + 1) of every lane moved to bits 4-5 by one shift.
template <int s>
inline __m256i high_field(__m256i hi) {
  const __m256i moved = s < 2 ? _mm256_slli_epi16(hi, 4 - 2 * s) : s == 2 ? hi : _mm256_srli_epi16(hi, 2 * s - 4);
  return _mm256_and_si256(moved, _mm256_set1_epi16(0x30));
}

// w5a16's high plane (16 bytes) in both halves of a register, at step s: bit 2s of the low half's lanes and
// bit 2s + 1 of the high half's, moved to bit 4 by one 32-bit shift with a count per half (VPSLLVD/VPSRLVD).
// A 32-bit shift carries bits across its two 16-bit lanes, but never into the bit kept: a right shift by c <=
// 11 brings the low lane's bit 4 from its own bit 4 + c <= 15, a left shift by c <= 4 the high lane's from its
// own bit 4 - c >= 0.
template <int s>
inline __m256i high_bit(__m256i plane) {
  constexpr int lo = 4 - 2 * s, hi = 3 - 2 * s;  // how far up each half's bit moves
  const __m256i moved = s < 2 ? _mm256_sllv_epi32(plane, _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi))
                              : _mm256_srlv_epi32(plane, _mm256_setr_epi32(-lo, -lo, -lo, -lo, -hi, -hi, -hi, -hi));
  return _mm256_and_si256(moved, _mm256_set1_epi16(0x10));
}

// one_row_groups' group g of 4 rows (blocking.h) of a split format (w6a16, w5a16: api.h's layout), block's steps
// with constant shifts: each half of a row's low plane loaded once, step s = 2u + h its nibble u OR-ed with
// high(s, the row's high plane), the high bits already at bit 4 (from L1: the group's bytes were just read).
template <int B, typename High>
inline void split_group_dot(const Grouped<B>& f, const uint8_t* w, int64_t row_bytes, int64_t g, __m256i* acc,
                            High high) {
  const int16_t* xg = f.x + 128 * g;
  const uint8_t* group = w + 16 * B * g;
  for (int r = 0; r < 4; ++r) acc[r] = Grouped<B>::zero();
  unrolled(std::integer_sequence<int, 0, 1>{}, [&](auto h) {
    __m256i v[4];
    for (int r = 0; r < 4; ++r) v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + r * row_bytes + 32 * h));
    unrolled(std::integer_sequence<int, 0, 1, 2, 3>{}, [&](auto u) {
      constexpr int s = 2 * u + h;
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 16 * s));
      for (int r = 0; r < 4; ++r)
        acc[r] = Grouped<B>::madd(acc[r], _mm256_or_si256(nibble<u>(v[r]), high(std::integral_constant<int, s>{}, group + r * row_bytes + 64)), xv);
    });
  });
}

// w6a16 (api.h's split layout): per 96 bytes (128 values), the low 4 bits as W4A16's 64 bytes and the high 2 as
// W2A16's 32: step s = 2u + h (values 16s..16s+15, as x is laid out) takes nibble u of half h and field s of the
// high plane, moved up by 4: a value below 64, so VPMADDWD's pairs (|q x| <= 63 * 32767 each) never overflow.
struct W6A16 : Grouped<6> {
  static constexpr int order(int i) { return W4A16::order(i); }   // each loaded half's steps together
  V wv(const State&, int64_t n, int64_t k, int s) const {
    const uint8_t* b = at(n, k);
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64));
    const __m256i high = _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(2 * s)), 4),
                                          _mm256_set1_epi16(0x30));
    return _mm256_or_si256(nibble_step(b, s), high);
  }
  // one_row_groups' group g of 4 rows (blocking.h): its high plane's field s, as loaded, at step s.
  void group_dot(const uint8_t* w, int64_t row_bytes, int64_t g, Acc* acc) const {
    split_group_dot(*this, w, row_bytes, g, acc, [](auto s, const uint8_t* plane) {
      return high_field<s>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane)));
    });
  }
};

// w5a16 (api.h's split layout): per 80 bytes (128 values), the low 4 bits as W4A16's 64 bytes, then 16 bytes of
// the high bit, whose 16-bit lane i (of 8) holds values i + 8u in bit u. Values 16s..16s+7 are bit 2s of the 8
// lanes and 16s+8..16s+15 bit 2s + 1: the plane goes to both halves of a register, the upper one shifted down
// by 1, so step s takes bit 2s of every lane, moved to bit 4 by one shift (either way) and a mask.
struct W5A16 : Grouped<5> {
  static constexpr int order(int i) { return W4A16::order(i); }   // each loaded half's steps together
  V wv(const State&, int64_t n, int64_t k, int s) const {
    const uint8_t* b = at(n, k);
    const __m128i plane = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 64));
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(plane), _mm_srli_epi16(plane, 1), 1);
    const int up = 4 - 2 * s;   // bit 2s to bit 4
    const __m256i moved = up >= 0 ? _mm256_sll_epi16(hi, _mm_cvtsi32_si128(up)) : _mm256_srl_epi16(hi, _mm_cvtsi32_si128(-up));
    return _mm256_or_si256(nibble_step(b, s), _mm256_and_si256(moved, _mm256_set1_epi16(0x10)));
  }
  // one_row_groups' group g of 4 rows (blocking.h): its 16-byte high plane broadcast to both halves (a load),
  // its bit moved by high_bit's one shift.
  void group_dot(const uint8_t* w, int64_t row_bytes, int64_t g, Acc* acc) const {
    split_group_dot(*this, w, row_bytes, g, acc, [](auto s, const uint8_t* plane) {
      return high_bit<s>(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane))));
    });
  }
};

// w4a8 (x from quantize_x8_w4, common.h): per 64 bytes, half h's low nibbles meet x bytes 32h..32h+31 of the
// block and its high nibbles x bytes 64 + 32h..: step s = 2 * (high) + h covers x bytes 32s..32s+31. The nibbles
// are the unsigned operand: VPDPBUSD where VNNI is, else VPMADDUBSW (|a pair| <= 2 * 15 * 127, never saturating)
// and VPMADDWD by ones.
struct W4A8 {
  using Acc = __m256i; using V = __m256i; using Sum = __m256; using State = float;
  static constexpr int kStep = 32, kSub = 4, kBits = 4; static constexpr bool kFolds = true;
  const int8_t* x; int64_t K; const float* x_scale;
  const uint8_t* w; const float* scale; const float* offset; const float* x_group; int64_t group;
  static constexpr int order(int i) { return 2 * (i & 1) + (i >> 1); }   // half 0's steps, then half 1's
  static Sum sum_zero() { return _mm256_setzero_ps(); }
  static Acc zero() { return _mm256_setzero_si256(); }
  int64_t span() const { return group; }
  State begin(int64_t n, int64_t k) const { return scale[n * (K / group) + k / group]; }
  const uint8_t* at(int64_t n, int64_t k) const { return w + n * (K / 2) + k / 2; }
  V wv(const State&, int64_t n, int64_t k, int s) const {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(n, k) + 32 * (s & 1)));
    return _mm256_and_si256(s < 2 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0xF));
  }
  V xv(int m, int64_t k) const { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + m * K + k)); }
#if QS_VNNI
  static Acc madd(Acc a, V w, V x) { return QS_DPBUSD(a, w, x); }
#else
  static Acc madd(Acc a, V w, V x) {
    return keep(_mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))));
  }
#endif
  static __m256 fold(__m256 sum, Acc a, const State& s) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps(s), sum);
  }
  // one_row_groups' group g of 4 rows (blocking.h), in block's order of steps: each half of the 4 rows loaded once.
  void group_dot(const uint8_t* w, int64_t row_bytes, int64_t g, Acc* acc) const {
    const int8_t* xg = x + 128 * g;
    const __m256i low = _mm256_set1_epi8(0xF);
    for (int r = 0; r < 4; ++r) acc[r] = zero();
    for (int h = 0; h < 2; ++h) {
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 32 * h));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 64 + 32 * h));
      for (int r = 0; r < 4; ++r) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * row_bytes + 64 * g + 32 * h));
        acc[r] = madd(acc[r], _mm256_and_si256(v, low), x0);
        acc[r] = madd(acc[r], _mm256_and_si256(_mm256_srli_epi16(v, 4), low), x1);
      }
    }
  }
  __m128 finish(__m128 sums, int64_t n, int m, int lanes) const {
    return int4_finish(sums, offset, x_group, K / group, x_scale[m], n, m, lanes);
  }
};

inline void put(float* y, __m128 v, int lanes) {
  if (lanes == 4) _mm_storeu_ps(y, v); else _mm_store_ss(y, v);
}

}  // namespace

// Many rows of x through a tile of unpacked weights (blocking.h's tiled): AVX2's 16 registers hold 2 rows a pass.
// Not in the VNNI builds, whose fused dot products leave less to save, and which no host here can test.
#if !QS_VNNI
#define QS_TILED 1
#endif
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

// AVX2 stores q as its two's-complement byte (common.h); the VNNI build as q + 128, for VPDPBUSD's
// unsigned operand.
void quantize_x8_variant(const float* x, int64_t M, int64_t K, uint8_t* q, float* x_scale) {
  quantize_x8(x, M, K, q, x_scale);
  if (QS_VNNI)
    for (int64_t i = 0; i < M * K; ++i) q[i] = uint8_t(q[i] + 128);
}

// common.h's quantize_x16, 16 values at a time, the same numbers bit for bit: max|x| with NaN skipped (as
// std::fmax skips it: VMAXPS returns its second operand, the running max, when a lane is NaN), q = x * (1 /
// scale) rounded half to even by VCVTPS2DQ under the default MXCSR, clamped to +-32767 as integers (a NaN
// or out-of-range lane converts to INT_MIN and clamps to -32767, where the scalar clamp of a NaN lands too).
// The scalar loop called libm's fmaxf and fminf per value: at a batch's 32 rows it took ~2/3 of w4a16's own
// time (perf, Gemma 3 270M's batched step).
void quantize_x16_simd(const float* x, int64_t M, int64_t K, int64_t group, int16_t* q, float* x_scale,
                       float* group_sums) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i hi = _mm256_set1_epi32(32767), lo = _mm256_set1_epi32(-32767);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    __m256 amax = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(row + k), magnitude), amax);
    float largest = hmax(amax);
    for (; k < K; ++k) largest = std::fmax(largest, std::fabs(row[k]));
    const float scale = std::fmax(largest, kX16Floor) / 32767.f, inv = 1.f / scale;
    x_scale[m] = scale;
    const __m256 vinv = _mm256_set1_ps(inv);
    int16_t* out = q + m * K;
    __m256i gsum = _mm256_setzero_si256();
    int32_t tail_sum = 0;
    k = 0;
    for (; k + 16 <= K; k += 16) {
      __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + k), vinv));  // MXCSR: nearest-even
      __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + k + 8), vinv));
      a = _mm256_max_epi32(_mm256_min_epi32(a, hi), lo);
      b = _mm256_max_epi32(_mm256_min_epi32(b, hi), lo);
      // VPACKSSDW interleaves 128-bit lanes: [a0 b0 | a1 b1], put back in order by one qword permute
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
      if (group > 0) {
        gsum = _mm256_add_epi32(gsum, _mm256_add_epi32(a, b));
        if ((k + 16) % group == 0) {
          group_sums[m * (K / group) + k / group] = float(_mm_cvtsi128_si32(sum1(gsum)));
          gsum = _mm256_setzero_si256();
        }
      }
    }
    // a group running on past the vectors: its sum so far, then the scalar tail's
    if (group > 0 && k < K) tail_sum = _mm_cvtsi128_si32(sum1(gsum));
    for (; k < K; ++k) {  // K not a multiple of 16: the scalar rounding
      const int32_t v = quant16(row[k], inv);
      out[k] = int16_t(v);
      if (group > 0) {
        tail_sum += v;
        if ((k + 1) % group == 0) {
          group_sums[m * (K / group) + k / group] = float(tail_sum);
          tail_sum = 0;
        }
      }
    }
  }
}

// common.h's quantize_x8_bf16, 8 at a time (avx512.cpp's, at 256 bits). K: a multiple of 8.
void quantize_x8_bf16_simd(const uint16_t* x, int64_t K, int64_t r0, int64_t r1, uint16_t* q, float* x_scale) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t m = r0; m < r1; ++m) {
    const uint16_t* row = x + m * K;
    __m256 amax = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, widen_bf16(row + k)));
    const float scale = std::max(hmax(amax), kX8Floor) / 127.f;
    x_scale[m] = scale;
    const __m256 s = _mm256_set1_ps(scale);
    for (int64_t k = 0; k < K; k += 8) {
      __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(widen_bf16(row + k), s));  // MXCSR: nearest-even
      v = _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
      const __m256i b = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(v)), 16);
      const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + m * K + k), packed);
    }
  }
}

void gemv_w8a8(const uint8_t* xq, const float* x_scale, const int8_t* w, const float* w_scale, const int32_t* w_sum,
               int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  W8A8 f{{w, reinterpret_cast<const int8_t*>(xq), K}, w_scale, w_sum, x_scale};
  gemv(f, M, N, n0, n1, y);
}

void gemv_w8a16(const int16_t* xq, const float* x_scale, const int8_t* w, const float* w_scale, int64_t M, int64_t K,
                int64_t N, int64_t n0, int64_t n1, float* y) {
  thread_local std::vector<int16_t> paired;
  if (static_cast<int64_t>(paired.size()) < M * K) paired.resize(M * K);
  pair_x(xq, M, K, paired.data());
  gemv(W8A16Pairs{{paired.data(), K, x_scale}, w, w_scale}, M, N, n0, n1, y);
}





void gemv_w4a8(const int8_t* xq, const float* x_scale, const float* group_sums, const uint8_t* w, const float* scale,
               const float* offset, int64_t group, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  gemv(W4A8{xq, K, x_scale, w, scale, offset, group_sums, group}, M, N, n0, n1, y);
}

// A group's 16 possible bf16 values as two byte tables (low and high bytes), looked up with VPSHUFB by
// each 16-bit lane's nibble: the same values, bit for bit, as the other variants' fp32 FMA then rounding.
void dequant_w4a16(const uint8_t* w, const float* scale, const float* offset, int64_t group, int64_t K, int64_t n0,
                   int64_t n1, uint16_t* o) {
  const int64_t G = K / group;
  const __m256i low = _mm256_set1_epi16(0xF), byte = _mm256_set1_epi16(0xFF);
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t g = 0; g < G; ++g) {
      alignas(16) uint8_t lo[16], hi[16];
      for (int q = 0; q < 16; ++q) {
        const uint16_t b = f32_to_bf16(std::fma(float(q), scale[n * G + g], offset[n * G + g]));
        lo[q] = uint8_t(b & 0xFF);
        hi[q] = uint8_t(b >> 8);
      }
      const __m256i tlo = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(lo)));
      const __m256i thi = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(hi)));
      for (int64_t k = g * group; k < (g + 1) * group; k += 128)
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + n * (K / 2) + k / 2 + 32 * h));
          for (int u = 0; u < 4; ++u) {
            const __m256i idx = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * u)), low);
            const __m256i b = _mm256_or_si256(_mm256_and_si256(_mm256_shuffle_epi8(tlo, idx), byte),
                                              _mm256_slli_epi16(_mm256_shuffle_epi8(thi, idx), 8));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + n * K + k + 32 * u + 16 * h), b);
          }
        }
    }
}


// fp32 to bf16 bits, 8 at a time, as common.h's f32_to_bf16: rounded to nearest even, a NaN as 0x7FC0.
inline __m256i bf16_bits(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
}

// The split formats' prefill unpacking (w6a16, w5a16): each step's 16 values as the decode step reads them
// (F::wv), widened to fp32, q * scale + offset in one FMA (as the reference's std::fma), rounded to bf16.
template <typename F>
void dequant_steps(const uint8_t* w, const float* scale_, const float* offset_, int64_t group, int64_t K, int64_t n0,
                   int64_t n1, uint16_t* o) {
  const F f{{{nullptr, K, nullptr}, w, scale_, offset_, nullptr, group}};  // the weight alone: no x
  const int64_t G = f.K / f.group;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k = 0; k < f.K; k += 128) {
      const __m256 scale = _mm256_set1_ps(f.scale[n * G + k / f.group]), offset = _mm256_set1_ps(f.offset[n * G + k / f.group]);
      for (int s = 0; s < 8; ++s) {
        const __m256i q = f.wv(0.f, n, k, s);
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(q)));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(q, 1)));
        const __m256i a = bf16_bits(_mm256_fmadd_ps(lo, scale, offset)), b = bf16_bits(_mm256_fmadd_ps(hi, scale, offset));
        // VPACKUSDW interleaves 128-bit lanes: [a0 b0 | a1 b1], put back in order by one qword permute
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + n * f.K + k + 16 * s),
                            _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8));
      }
    }
}

// --- attention for a few queries: each query row on its own, in a fixed order ------------------------
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return widen_bf16(p); }

// e^x for x <= 0, 8 at a time: Cephes' expf polynomial, times 2^n built in the exponent bits (n >= -126
// for x >= -87, so 2^n is a normal float).
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// DB = head dim / 8. The value rows are summed a block of up to 8 registers of the output at a time (a
// 256-dim head would need 32 accumulators, twice the register file).
template <int DB, typename T>
void attend(const T* q, const T* k, const T* v, int64_t head_stride, T* out, int64_t H, int64_t KVH, int64_t Q,
            int64_t L, float scale, int64_t i0, int64_t i1) {
  constexpr int64_t D = DB * 8;
  constexpr int kBlock = DB < 8 ? DB : 8;
  const int64_t group = H / KVH;
  std::vector<float> scores(L + 8);
  alignas(32) float qf[D];
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t h = item / Q, i = item % Q, n = L - Q + i + 1;
    const T* kh = k + (h / group) * head_stride;
    const T* vh = v + (h / group) * head_stride;
    for (int64_t d = 0; d < D; ++d) qf[d] = load(q + item * D, d);
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {   // four keys at a time
      __m256 s[4];
      for (int r = 0; r < 4; ++r) {
        s[r] = _mm256_mul_ps(_mm256_load_ps(qf), load8(kh + (j + r) * D));
        for (int d = 1; d < DB; ++d) s[r] = _mm256_fmadd_ps(_mm256_load_ps(qf + 8 * d), load8(kh + (j + r) * D + 8 * d), s[r]);
      }
      _mm_storeu_ps(&scores[j], _mm_mul_ps(sum4(s), _mm_set1_ps(scale)));
    }
    for (; j < n; ++j) {
      __m256 s = _mm256_mul_ps(_mm256_load_ps(qf), load8(kh + j * D));
      for (int d = 1; d < DB; ++d) s = _mm256_fmadd_ps(_mm256_load_ps(qf + 8 * d), load8(kh + j * D + 8 * d), s);
      scores[j] = hsum(s) * scale;
    }
    float best = -std::numeric_limits<float>::infinity();
    for (j = 0; j < n; ++j) best = std::max(best, scores[j]);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j < n; j += 8) {   // lanes past n: zero, whatever the buffer held
      const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(n - j)), iota));
      const __m256 p = _mm256_and_ps(keep, exp8(_mm256_sub_ps(_mm256_loadu_ps(&scores[j]), _mm256_set1_ps(best))));
      _mm256_storeu_ps(&scores[j], p);
      sum = _mm256_add_ps(sum, p);
    }
    const __m256 total = _mm256_set1_ps(hsum(sum));
    for (int d0 = 0; d0 < DB; d0 += kBlock) {
      __m256 acc[kBlock];
      for (int d = 0; d < kBlock; ++d) acc[d] = _mm256_setzero_ps();
      for (j = 0; j < n; ++j) {
        const __m256 p = _mm256_set1_ps(scores[j]);
        for (int d = 0; d < kBlock; ++d) acc[d] = _mm256_fmadd_ps(p, load8(vh + j * D + 8 * (d0 + d)), acc[d]);
      }
      alignas(32) float row[8];
      for (int d = 0; d < kBlock; ++d) {
        _mm256_store_ps(row, _mm256_div_ps(acc[d], total));
        for (int l = 0; l < 8; ++l) store(out + item * D + 8 * (d0 + d), l, row[l]);
      }
    }
  }
}

template <typename T>
void attention(const T* q, const T* k, const T* v, int64_t hs, int64_t H, int64_t KVH, int64_t Q, int64_t L, int64_t D,
               float scale, int64_t i0, int64_t i1, T* out) {
  switch (D) {
    case 16: attend<2>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    case 32: attend<4>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    case 64: attend<8>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    case 128: attend<16>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    default: attend<32>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
  }
}

// --- many rows on int8 activations (api.h's gemm_grouped_x8: a prefill's GEMM), as avx512.cpp's ----------------
// A panel of 16 output columns unpacked once per call into 32-byte vectors, each one quad (4 consecutive k) of 8
// columns, which every 2 rows of x meet with their quad broadcast: VPDPBUSD where VNNI is, else VPMADDUBSW (a pair
// of u8 q <= 63 times s8 x: at most 2 * 63 * 127, never saturating) and VPMADDWD by ones.
constexpr int64_t X8_NR = 16;  // columns per panel: two vectors of 8
constexpr int X8_MR = 2;       // rows a tile: 4 integer and 4 float sums, 2 weights, scales in 16 registers

// A format's step s (16 int16 values 16s..16s+15, natural order) for the panel's unpacking.
template <typename F>
inline __m256i x8_step(const F& f, int64_t n, int64_t k, int s) { return f.wv(0.f, n, k, s); }

// Dword d of pack(step 2i, step 2i + 1) (VPACKUSWB packs within 128-bit lanes) holds quad 4(2i + t / 2) + 2L + t % 2
// (L = d / 4, t = d % 4); position 8i + d of the panel is that dword, and x's quad is read from there.
constexpr int x8_quad(int pos) {
  const int i = pos / 8, d = pos % 8, L = d / 4, t = d % 4;
  return 4 * (2 * i + t / 2) + 2 * L + t % 2;
}

// r[c] (column c's 8 dwords) to out[d] (dword d of every column, lane c).
inline void transpose8(const __m256i* r, __m256i* out) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // u[4i + j] lane L: columns 4i..4i+3 at dword 4L + j
    u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    out[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
    out[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
  }
}

template <typename F>
void x8_pack(const F& f, const float* scale, const float* offset, int64_t group, int64_t K, int64_t N, int64_t n,
             __m256i* panel, float* sc, float* of) {
  const int64_t chunks = K / 128, G = K / group;
  for (int64_t c = 0; c < chunks; ++c)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 4; ++i) {
        __m256i r[8];
        for (int j = 0; j < 8; ++j) {
          const int64_t row = n + 8 * h + j;
          r[j] = row < N ? _mm256_packus_epi16(x8_step(f, row, 128 * c, 2 * i), x8_step(f, row, 128 * c, 2 * i + 1))
                         : _mm256_setzero_si256();
        }
        __m256i t[8];
        transpose8(r, t);
        for (int d = 0; d < 8; ++d) panel[(c * 32 + 8 * i + d) * 2 + h] = t[d];
      }
  x8_panel_scales(scale, offset, G, N, n, X8_NR, sc, of);
}

inline __m256i x8_dot(__m256i a, __m256i w, __m256i x) {
#if QS_VNNI
  return QS_DPBUSD(a, w, x);
#else
  return keep(_mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))));
#endif
}

template <int MR>
void x8_tile(const __m256i* panel, const float* sc, const float* of, const int8_t* xm, const float* xs, const float* xo,
             int64_t K, int64_t group, float* y, int64_t N, int64_t n, int64_t width) {
  const int64_t chunks = K / 128, per_group = group / 128;
  __m256 f[MR][2];
  for (int m = 0; m < MR; ++m) f[m][0] = f[m][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m256i a[MR][2];
    for (int m = 0; m < MR; ++m) a[m][0] = a[m][1] = _mm256_setzero_si256();
    const __m256i* pc = panel + c * 64;
    const int8_t* xc = xm + c * 128;
#pragma GCC unroll 32
    for (int p = 0; p < 32; ++p) {
      const __m256i w0 = _mm256_load_si256(pc + 2 * p), w1 = _mm256_load_si256(pc + 2 * p + 1);
      for (int m = 0; m < MR; ++m) {
        int32_t q;
        memcpy(&q, xc + m * K + 4 * x8_quad(p), 4);
        const __m256i xb = _mm256_set1_epi32(q);
        a[m][0] = x8_dot(a[m][0], w0, xb);
        a[m][1] = x8_dot(a[m][1], w1, xb);
      }
    }
    const int64_t g = c / per_group;
    const __m256 s0 = _mm256_loadu_ps(sc + g * X8_NR), s1 = _mm256_loadu_ps(sc + g * X8_NR + 8);
    const __m256 o0 = _mm256_loadu_ps(of + g * X8_NR), o1 = _mm256_loadu_ps(of + g * X8_NR + 8);
    for (int m = 0; m < MR; ++m) {
      const __m256 sx = _mm256_set1_ps(xs[m * chunks + c]), xov = _mm256_set1_ps(xo[m * chunks + c]);
      f[m][0] = _mm256_fmadd_ps(o0, xov, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[m][0]), _mm256_mul_ps(s0, sx), f[m][0]));
      f[m][1] = _mm256_fmadd_ps(o1, xov, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[m][1]), _mm256_mul_ps(s1, sx), f[m][1]));
    }
  }
  for (int m = 0; m < MR; ++m) {
    alignas(32) float row[16];
    _mm256_store_ps(row, f[m][0]);
    _mm256_store_ps(row + 8, f[m][1]);
    std::copy(row, row + width, y + m * N + n);
  }
}

template <typename F>
void gemm_grouped_x8(const int8_t* xq, const float* xs, const float* xo, const uint8_t* w, const float* scale,
                     const float* offset, int64_t group, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1,
                     float* y) {
  const int64_t chunks = K / 128, G = K / group;
  const F f{{{nullptr, K, nullptr}, w, scale, offset, nullptr, group}};
  thread_local std::vector<__m256i> panel;  // C++17: allocated at the vector type's 32-byte alignment
  thread_local std::vector<float> sc, of;
  panel.resize(chunks * 64);
  sc.resize(G * X8_NR);
  of.resize(G * X8_NR);
  for (int64_t n = n0; n < n1; n += X8_NR) {
    const int64_t width = std::min<int64_t>(X8_NR, n1 - n);
    x8_pack(f, scale, offset, group, K, n1, n, panel.data(), sc.data(), of.data());
    int64_t m = 0;
    for (; m + X8_MR <= M; m += X8_MR)
      x8_tile<X8_MR>(panel.data(), sc.data(), of.data(), xq + m * K, xs + m * chunks, xo + m * chunks, K, group,
                     y + m * N, N, n, width);
    for (; m < M; ++m)
      x8_tile<1>(panel.data(), sc.data(), of.data(), xq + m * K, xs + m * chunks, xo + m * chunks, K, group, y + m * N,
                 N, n, width);
  }
}

// Grouped formats without an entry here run the best kernel of a variant below that the CPU runs (api.h).
const qs_kernels table = [] {
  qs_kernels t = {QS_ABI, QS_NAME, 1, gemv_f32, gemv_bf16, quantize_x8_variant, gemv_w8a8, quantize_x16_simd, gemv_w8a16,
                  quantize_x8_w4, gemv_w4a8, quantize_x8_bf16_simd, scale_rows_bf16, rms_norm<float>, rms_norm<uint16_t>,
                  attention<float>, attention<uint16_t>};
  t.gemv_grouped[QS_W4A16] = grouped_gemv<W4A16>;
  t.dequant_grouped[QS_W4A16] = dequant_w4a16;
  t.gemv_grouped[QS_W2A16] = grouped_gemv<W2A16>;  // its prefill's unpacking: the reference's
  t.gemv_grouped[QS_W6A16] = grouped_gemv<W6A16>;
  t.dequant_grouped[QS_W6A16] = dequant_steps<W6A16>;
  t.gemv_grouped[QS_W5A16] = grouped_gemv<W5A16>;
  t.dequant_grouped[QS_W5A16] = dequant_steps<W5A16>;
  t.quantize_x8_blocks = quantize_x8_blocks;
  t.gemm_grouped_x8[QS_W4A16] = gemm_grouped_x8<W4A16>;
  t.gemm_grouped_x8[QS_W6A16] = gemm_grouped_x8<W6A16>;
  t.gemm_grouped_x8[QS_W5A16] = gemm_grouped_x8<W5A16>;
  return t;
}();

}  // namespace

extern "C" const qs_kernels* qs_kernels_get(void) { return &table; }
