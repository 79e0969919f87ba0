// The Arm64 variant: NEON (every AArch64 CPU), with SDOT where compiled for armv8.2-a+dotprod (Apple M1
// and later, Snapdragon X, Graviton 2 and later). The same blocking as the x86 variants at 128 bits:
//   f32     FMA                 bf16    weights widened to fp32 by a shift (SHLL), FMA
//   w8a8    SDOT: signed int8 x int8 into int32 lanes, 16 MACs per instruction; without it, SMULL
//           into int16 pairs (|products| <= 127 * 127) and SADALP into int32
//   w8a16   int8 weights widened to int16, SMLAL into int32, folded into fp32 every 1024 values
//   w4a16   the nibbles as int16 by a shift and a mask, SMLAL, each group's sum scaled in fp32
//   w6a16, w5a16  w4a16's nibbles with the high plane's bits shifted and masked into bits 4-5 (or 4)
// Its speed cannot be measured on this project's machines; its arithmetic is checked under qemu against
// the reference variant (core/selftest.cpp, tests/kernels/test_kernels_selftest.py).
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "api.h"
#include "common.h"

namespace {

using namespace qs;

constexpr int kRows = 4;
constexpr int kMaxM = 4;   // 32 registers: 4 x 4 accumulators, 4 weights, x

inline float32x4_t sum4(const float32x4_t* a) { return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3])); }
inline int32x4_t sum4(const int32x4_t* a) { return vpaddq_s32(vpaddq_s32(a[0], a[1]), vpaddq_s32(a[2], a[3])); }
inline float32x4_t sum1(float32x4_t a) { return vsetq_lane_f32(vaddvq_f32(a), vdupq_n_f32(0.f), 0); }
inline int32x4_t sum1(int32x4_t a) { return vsetq_lane_s32(vaddvq_s32(a), vdupq_n_s32(0), 0); }
inline void put(float* y, float32x4_t v, int lanes) {
  if (lanes == 4) vst1q_f32(y, v); else vst1q_lane_f32(y, v, 0);
}
inline float32x4_t lanes4(const float* p, int lanes) {   // up to 4 values, zeros after
  float v[4] = {0, 0, 0, 0};
  for (int i = 0; i < lanes; ++i) v[i] = p[i];
  return vld1q_f32(v);
}

// 16 int8 products summed into 4 int32 lanes: SDOT, or SMULL into int16 pairs (|products| <= 127 * 127) and SADALP.
inline int32x4_t dot_s8(int32x4_t a, int8x16_t w, int8x16_t x) {
#ifdef __ARM_FEATURE_DOTPROD
  return vdotq_s32(a, w, x);
#else
  a = vpadalq_s16(a, vmull_s8(vget_low_s8(w), vget_low_s8(x)));
  return vpadalq_s16(a, vmull_high_s8(w, x));
#endif
}

struct NoState {};

template <typename W, typename X>
struct Dense {
  using State = NoState;
  const W* w; const X* x; int64_t K;
  int64_t span() const { return K; }
  State begin(int64_t, int64_t) const { return {}; }
  const W* at(int64_t n, int64_t k) const { return w + n * K + k; }
  const X* x_at(int m, int64_t k) const { return x + m * K + k; }
  float32x4_t finish(float32x4_t sums, int64_t, int, int) const { return sums; }
};

struct F32 : Dense<float, float> {
  using Acc = float32x4_t; using V = float32x4_t; using Sum = Acc;
  static constexpr int kStep = 4, kSub = 1;
  V wv(const State&, int64_t n, int64_t k) const { return vld1q_f32(at(n, k)); }
  V xv(int m, int64_t k) const { return vld1q_f32(x_at(m, k)); }
  static Acc zero() { return vdupq_n_f32(0.f); }
  static Sum sum_zero() { return zero(); }
  static Acc madd(Acc a, V w, V x) { return vfmaq_f32(a, w, x); }
};

struct Bf16 : Dense<uint16_t, uint16_t> {   // x and weights widened to fp32 as loaded (bf16 is exact in fp32)
  using Acc = float32x4_t; using V = float32x4_t; using Sum = Acc;
  static constexpr int kStep = 4, kSub = 2;
  V wv(const State&, int64_t n, int64_t k, int u) const {
    const uint16x8_t v = vld1q_u16(at(n, k));
    return vreinterpretq_f32_u32(u ? vshll_high_n_u16(v, 16) : vshll_n_u16(vget_low_u16(v), 16));
  }
  V xv(int m, int64_t k) const { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(x_at(m, k)), 16)); }
  static Acc zero() { return vdupq_n_f32(0.f); }
  static Sum sum_zero() { return zero(); }
  static Acc madd(Acc a, V w, V x) { return vfmaq_f32(a, w, x); }
};

struct W8A8 : Dense<int8_t, int8_t> {
  using Acc = int32x4_t; using V = int8x16_t; using Sum = Acc;
  static constexpr int kStep = 16, kSub = 1;
  const float* w_scale; const float* x_scale;
  V wv(const State&, int64_t n, int64_t k) const { return vld1q_s8(at(n, k)); }
  V xv(int m, int64_t k) const { return vld1q_s8(x_at(m, k)); }
  static Acc zero() { return vdupq_n_s32(0); }
  static Sum sum_zero() { return zero(); }
  static Acc madd(Acc a, V w, V x) { return dot_s8(a, w, x); }
  float32x4_t finish(int32x4_t sums, int64_t n, int m, int lanes) const {
    return vmulq_n_f32(vmulq_f32(vcvtq_f32_s32(sums), lanes4(w_scale + n, lanes)), x_scale[m]);
  }
};

struct Int16X {
  using Acc = int32x4_t; using V = int16x8_t; using Sum = float32x4_t;
  static constexpr int kStep = 8; static constexpr bool kFolds = true;
  const int16_t* x; int64_t K; const float* x_scale;
  V xv(int m, int64_t k) const { return vld1q_s16(x + m * K + k); }
  static Acc zero() { return vdupq_n_s32(0); }
  static Sum sum_zero() { return vdupq_n_f32(0.f); }
  static Acc madd(Acc a, V w, V x) { return vmlal_high_s16(vmlal_s16(a, vget_low_s16(w), vget_low_s16(x)), w, x); }
};

struct W8A16 : Int16X {
  using State = NoState; static constexpr int kSub = 1;
  const int8_t* w; const float* w_scale;
  int64_t span() const { return std::min<int64_t>(K, 1024); }   // 2 * 127 * 32767 per lane per step
  State begin(int64_t, int64_t) const { return {}; }
  const int8_t* at(int64_t n, int64_t k) const { return w + n * K + k; }
  V wv(const State&, int64_t n, int64_t k) const { return vmovl_s8(vld1_s8(at(n, k))); }
  static Sum fold(Sum sum, Acc a, const State&) { return vaddq_f32(sum, vcvtq_f32_s32(a)); }
  float32x4_t finish(float32x4_t sums, int64_t n, int m, int lanes) const {
    return vmulq_n_f32(vmulq_f32(sums, lanes4(w_scale + n, lanes)), x_scale[m]);
  }
};

// An int4 format's last step (w = q * scale + offset per group): the offsets meet x's group sums, then x's scale.
inline float32x4_t int4_finish(float32x4_t sums, const float* offset, const float* x_group, int64_t G, float x_scale,
                               int64_t n, int m, int lanes) {
  float off[4] = {0, 0, 0, 0};
  for (int r = 0; r < lanes; ++r) {
    float acc = 0.f;
    for (int64_t g = 0; g < G; ++g) acc = std::fma(offset[(n + r) * G + g], x_group[m * G + g], acc);
    off[r] = acc;
  }
  return vmulq_n_f32(vaddq_f32(sums, vld1q_f32(off)), x_scale);
}

// What every grouped weight-only format of B bits shares (api.h's layout): int16 x, 128 values a load group (16
// steps of 8), each group's integer sums folded into fp32 by its scale, the offsets met by x's group sums at the end.
template <int B>
struct Grouped : Int16X {
  using State = float; static constexpr int kSub = 16;
  const uint8_t* w; const float* scale; const float* offset; const float* x_group; int64_t group;
  int64_t span() const { return group; }
  State begin(int64_t n, int64_t k) const { return scale[n * (K / group) + k / group]; }
  const uint8_t* at(int64_t n, int64_t k) const { return w + n * (K * B / 8) + k * B / 8; }
  static Sum fold(Sum sum, Acc a, const State& s) { return vfmaq_n_f32(sum, vcvtq_f32_s32(a), s); }
  float32x4_t finish(float32x4_t sums, int64_t n, int m, int lanes) const {
    return int4_finish(sums, offset, x_group, K / group, x_scale[m], n, m, lanes);
  }
};

// Per 64 bytes (128 values): 16-byte quarter c holds lanes 8c..8c+7, whose nibble u are values
// 32u + 8c + 0..7: step s = 4u + c covers values 8s..8s+7, as x is laid out.
inline uint16x8_t nibble_step(const uint8_t* plane, int s) {
  const uint16x8_t v = vld1q_u16(reinterpret_cast<const uint16_t*>(plane + 16 * (s & 3)));
  return vandq_u16(vshlq_u16(v, vdupq_n_s16(int16_t(-4 * (s >> 2)))), vdupq_n_u16(0xF));
}

struct W4A16 : Grouped<4> {
  V wv(const State&, int64_t n, int64_t k, int s) const { return vreinterpretq_s16_u16(nibble_step(at(n, k), s)); }
};

// w6a16 (api.h's split layout): per 96 bytes (128 values), the low 4 bits as W4A16's 64 bytes, then the high 2
// in 32 bytes whose 16-bit lane i (of 16) holds values i + 16f in field f. Step s (values 8s..8s+7) takes lanes
// 8 (s & 1).. of field s >> 1, moved to bits 4-5 by one shift (VSHL by a signed count: negative shifts right).
struct W6A16 : Grouped<6> {
  V wv(const State&, int64_t n, int64_t k, int s) const {
    const uint8_t* b = at(n, k);
    const uint16x8_t hi = vld1q_u16(reinterpret_cast<const uint16_t*>(b + 64 + 16 * (s & 1)));
    const uint16x8_t high = vandq_u16(vshlq_u16(hi, vdupq_n_s16(int16_t(4 - 2 * (s >> 1)))), vdupq_n_u16(0x30));
    return vreinterpretq_s16_u16(vorrq_u16(nibble_step(b, s), high));
  }
};

// w5a16 (api.h's split layout): per 80 bytes (128 values), the low 4 bits as W4A16's 64 bytes, then 16 bytes
// whose 16-bit lane i (of 8) holds values i + 8u in bit u: step s (values 8s..8s+7) takes bit s of every lane,
// moved to bit 4 by one shift.
struct W5A16 : Grouped<5> {
  V wv(const State&, int64_t n, int64_t k, int s) const {
    const uint8_t* b = at(n, k);
    const uint16x8_t hi = vld1q_u16(reinterpret_cast<const uint16_t*>(b + 64));
    const uint16x8_t high = vandq_u16(vshlq_u16(hi, vdupq_n_s16(int16_t(4 - s))), vdupq_n_u16(0x10));
    return vreinterpretq_s16_u16(vorrq_u16(nibble_step(b, s), high));
  }
};

// w4a8 (x from quantize_x8_w4, common.h): per 64 bytes, 16-byte quarter c's low nibbles meet x bytes 16c..16c+15
// and its high nibbles x bytes 64 + 16c..: step s = 4 * (high) + c covers x bytes 16s..16s+15. The nibbles are
// 0..15, so they are int8 for SDOT (or SMULL: |products| <= 15 * 127, a pair's sum fits int16).
struct W4A8 {
  using Acc = int32x4_t; using V = int8x16_t; using Sum = float32x4_t; using State = float;
  static constexpr int kStep = 16, kSub = 8; static constexpr bool kFolds = true;
  const int8_t* x; int64_t K; const float* x_scale;
  const uint8_t* w; const float* scale; const float* offset; const float* x_group; int64_t group;
  int64_t span() const { return group; }
  State begin(int64_t n, int64_t k) const { return scale[n * (K / group) + k / group]; }
  const uint8_t* at(int64_t n, int64_t k) const { return w + n * (K / 2) + k / 2; }
  V wv(const State&, int64_t n, int64_t k, int s) const {
    const uint8x16_t v = vld1q_u8(at(n, k) + 16 * (s & 3));
    return vreinterpretq_s8_u8(s < 4 ? vandq_u8(v, vdupq_n_u8(0xF)) : vshrq_n_u8(v, 4));
  }
  V xv(int m, int64_t k) const { return vld1q_s8(x + m * K + k); }
  static Acc zero() { return vdupq_n_s32(0); }
  static Sum sum_zero() { return vdupq_n_f32(0.f); }
  static Acc madd(Acc a, V w, V x) { return dot_s8(a, w, x); }
  static Sum fold(Sum sum, Acc a, const State& s) { return vfmaq_n_f32(sum, vcvtq_f32_s32(a), s); }
  float32x4_t finish(float32x4_t sums, int64_t n, int m, int lanes) const {
    return int4_finish(sums, offset, x_group, K / group, x_scale[m], n, m, lanes);
  }
};

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

void gemv_w8a8(const uint8_t* xq, const float* x_scale, const int8_t* w, const float* w_scale, const int32_t*,
               int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  gemv(W8A8{{w, reinterpret_cast<const int8_t*>(xq), K}, w_scale, x_scale}, M, N, n0, n1, y);
}

void gemv_w8a16(const int16_t* xq, const float* x_scale, const int8_t* w, const float* w_scale, int64_t M, int64_t K,
                int64_t N, int64_t n0, int64_t n1, float* y) {
  gemv(W8A16{{xq, K, x_scale}, w, w_scale}, M, N, n0, n1, y);
}

void gemv_w4a8(const int8_t* xq, const float* x_scale, const float* group_sums, const uint8_t* w, const float* scale,
               const float* offset, int64_t group, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  gemv(W4A8{xq, K, x_scale, w, scale, offset, group_sums, group}, M, N, n0, n1, y);
}




// A group's 16 bf16 values as low- and high-byte tables, looked up with TBL by each lane's nibble.
void dequant_w4a16(const uint8_t* w, const float* scale, const float* offset, int64_t group, int64_t K, int64_t n0,
                   int64_t n1, uint16_t* o) {
  const int64_t G = K / group;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t g = 0; g < G; ++g) {
      uint8_t lo[16], hi[16];
      for (int q = 0; q < 16; ++q) {
        const uint16_t b = f32_to_bf16(std::fma(float(q), scale[n * G + g], offset[n * G + g]));
        lo[q] = uint8_t(b & 0xFF);
        hi[q] = uint8_t(b >> 8);
      }
      const uint8x16_t tlo = vld1q_u8(lo), thi = vld1q_u8(hi);
      for (int64_t k = g * group; k < (g + 1) * group; k += 128)
        for (int c = 0; c < 4; ++c) {
          const uint16x8_t v = vld1q_u16(reinterpret_cast<const uint16_t*>(w + n * (K / 2) + k / 2 + 16 * c));
          for (int u = 0; u < 4; ++u) {
            const uint8x16_t idx = vreinterpretq_u8_u16(vandq_u16(vshlq_u16(v, vdupq_n_s16(int16_t(-4 * u))), vdupq_n_u16(0xF)));
            const uint16x8_t l = vandq_u16(vreinterpretq_u16_u8(vqtbl1q_u8(tlo, idx)), vdupq_n_u16(0xFF));
            const uint16x8_t h = vshlq_n_u16(vreinterpretq_u16_u8(vqtbl1q_u8(thi, idx)), 8);
            vst1q_u16(o + n * K + k + 32 * u + 8 * c, vorrq_u16(l, h));
          }
        }
    }
}


// fp32 to bf16 bits, 4 at a time, as common.h's f32_to_bf16: rounded to nearest even, a NaN as 0x7FC0.
inline uint16x4_t bf16_bits(float32x4_t v) {
  const uint32x4_t u = vreinterpretq_u32_f32(v);
  const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7FFF)), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1))), 16);
  const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7FFFFFFF)), vdupq_n_u32(0x7F800000));
  return vmovn_u32(vbslq_u32(nan, vdupq_n_u32(0x7FC0), rounded));
}

// The split formats' prefill unpacking (w6a16, w5a16): each step's 8 values as the decode step reads them
// (F::wv), widened to fp32, q * scale + offset in one FMA (as the reference's std::fma), rounded to bf16.
template <typename F>
void dequant_steps(const uint8_t* w, const float* scale_, const float* offset_, int64_t group, int64_t K, int64_t n0,
                   int64_t n1, uint16_t* o) {
  const F f{{{nullptr, K, nullptr}, w, scale_, offset_, nullptr, group}};  // the weight alone: no x
  const int64_t G = f.K / f.group;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k = 0; k < f.K; k += 128) {
      const float32x4_t scale = vdupq_n_f32(f.scale[n * G + k / f.group]), offset = vdupq_n_f32(f.offset[n * G + k / f.group]);
      for (int s = 0; s < 16; ++s) {
        const uint16x8_t q = vreinterpretq_u16_s16(f.wv(0.f, n, k, s));
        const float32x4_t lo = vcvtq_f32_u32(vmovl_u16(vget_low_u16(q))), hi = vcvtq_f32_u32(vmovl_high_u16(q));
        vst1q_u16(o + n * f.K + k + 8 * s,
                  vcombine_u16(bf16_bits(vfmaq_f32(offset, lo, scale)), bf16_bits(vfmaq_f32(offset, hi, scale))));
      }
    }
}

// --- attention for a few queries: each query row on its own, in a fixed order ------------------------
inline float32x4_t load4(const float* p) { return vld1q_f32(p); }
inline float32x4_t load4(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }

// e^x for x <= 0, 4 at a time: Cephes' expf polynomial times 2^n built in the exponent bits.
inline float32x4_t exp4(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-87.f));
  const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.f)), p, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

template <int DB, typename T>   // DB = head dim / 4; the output summed 8 registers at a time
void attend(const T* q, const T* k, const T* v, int64_t head_stride, T* out, int64_t H, int64_t KVH, int64_t Q,
            int64_t L, float scale, int64_t i0, int64_t i1) {
  constexpr int64_t D = DB * 4;
  constexpr int kBlock = DB < 8 ? DB : 8;
  const int64_t group = H / KVH;
  std::vector<float> scores(L + 4);
  float qf[D];
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t h = item / Q, i = item % Q, n = L - Q + i + 1;
    const T* kh = k + (h / group) * head_stride;
    const T* vh = v + (h / group) * head_stride;
    for (int64_t d = 0; d < D; ++d) qf[d] = load(q + item * D, d);
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      float32x4_t s[4];
      for (int r = 0; r < 4; ++r) {
        s[r] = vmulq_f32(vld1q_f32(qf), load4(kh + (j + r) * D));
        for (int d = 1; d < DB; ++d) s[r] = vfmaq_f32(s[r], vld1q_f32(qf + 4 * d), load4(kh + (j + r) * D + 4 * d));
      }
      vst1q_f32(&scores[j], vmulq_n_f32(sum4(s), scale));
    }
    for (; j < n; ++j) {
      float32x4_t s = vmulq_f32(vld1q_f32(qf), load4(kh + j * D));
      for (int d = 1; d < DB; ++d) s = vfmaq_f32(s, vld1q_f32(qf + 4 * d), load4(kh + j * D + 4 * d));
      scores[j] = vaddvq_f32(s) * scale;
    }
    float best = -std::numeric_limits<float>::infinity();
    for (j = 0; j < n; ++j) best = std::max(best, scores[j]);
    float32x4_t sum = vdupq_n_f32(0.f);
    const int32x4_t iota = {0, 1, 2, 3};
    for (j = 0; j < n; j += 4) {   // lanes past n: zero, whatever the buffer held
      const uint32x4_t keep = vcltq_s32(iota, vdupq_n_s32(int32_t(n - j)));
      const float32x4_t p = vreinterpretq_f32_u32(
          vandq_u32(keep, vreinterpretq_u32_f32(exp4(vsubq_f32(vld1q_f32(&scores[j]), vdupq_n_f32(best))))));
      vst1q_f32(&scores[j], p);
      sum = vaddq_f32(sum, p);
    }
    const float total = vaddvq_f32(sum);
    for (int d0 = 0; d0 < DB; d0 += kBlock) {
      float32x4_t acc[kBlock];
      for (int d = 0; d < kBlock; ++d) acc[d] = vdupq_n_f32(0.f);
      for (j = 0; j < n; ++j)
        for (int d = 0; d < kBlock; ++d) acc[d] = vfmaq_n_f32(acc[d], load4(vh + j * D + 4 * (d0 + d)), scores[j]);
      for (int d = 0; d < kBlock; ++d) {
        float row[4];
        vst1q_f32(row, vdivq_f32(acc[d], vdupq_n_f32(total)));
        for (int l = 0; l < 4; ++l) store(out + item * D + 4 * (d0 + d), l, row[l]);
      }
    }
  }
}

template <typename T>
void attention(const T* q, const T* k, const T* v, int64_t hs, int64_t H, int64_t KVH, int64_t Q, int64_t L, int64_t D,
               float scale, int64_t i0, int64_t i1, T* out) {
  switch (D) {
    case 16: attend<4>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    case 32: attend<8>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    case 64: attend<16>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    case 128: attend<32>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
    default: attend<64>(q, k, v, hs, out, H, KVH, Q, L, scale, i0, i1); break;
  }
}

#ifdef __ARM_FEATURE_DOTPROD
constexpr const char* kName = "neon_dotprod";
#else
constexpr const char* kName = "neon";
#endif

// Grouped formats without an entry here run the best kernel of a variant below that the CPU runs (api.h).
const qs_kernels table = [] {
  qs_kernels t = {QS_ABI, kName, 1, gemv_f32, gemv_bf16, quantize_x8, gemv_w8a8, quantize_x16, gemv_w8a16,
                  quantize_x8_w4, gemv_w4a8, quantize_x8_bf16, scale_rows_bf16, rms_norm<float>, rms_norm<uint16_t>,
                  attention<float>, attention<uint16_t>};
  t.gemv_grouped[QS_W4A16] = grouped_gemv<W4A16>;
  t.dequant_grouped[QS_W4A16] = dequant_w4a16;
  t.gemv_grouped[QS_W6A16] = grouped_gemv<W6A16>;
  t.dequant_grouped[QS_W6A16] = dequant_steps<W6A16>;
  t.gemv_grouped[QS_W5A16] = grouped_gemv<W5A16>;
  t.dequant_grouped[QS_W5A16] = dequant_steps<W5A16>;
  t.quantize_x8_blocks = quantize_x8_blocks;
  return t;
}();

}  // namespace

extern "C" const qs_kernels* qs_kernels_get(void) { return &table; }
