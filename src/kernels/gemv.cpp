// quantspec's small-batch matmul kernels: y[M, N] = x[M, K] @ W[N, K]^T for a few rows M (a decode
// step is 1, verifying k draft tokens is k), for each weight format a decode step reads:
//   gemv_float  W fp32 (x fp32, FMA)          or W bf16 (x rounded to bf16, VDPBF16PS: 32 MACs/op)
//   gemv_w8a8   W int8 per-row scale, x quantized per row to int8 here (VPDPBUSD: 64 MACs/op)
//   gemv_w8a16  W int8 per-row scale, x quantized per row to int16 here (VPDPWSSD: 32 MACs/op)
//   gemv_w4a16  W int4 in groups (of 128 or a multiple) along K, scale and offset per group, x int16
//               (VPDPWSSD on the nibbles themselves; each group's sum scaled in fp32)
// and dequant_w4a16, the int4 weight unpacked to bf16 for a prefill's GEMM.
// Every weight vector loaded is used for all M rows in registers, so verifying k tokens reads W once.
//
// Why our own: a decode step is memory bound, and on this project's 2-core AVX-512 host ATen's bf16
// GEMV reached ~19 GB/s on Gemma 3's 262144 x 640 head against a ~38 GB/s read probe; conversions
// per element (int8 -> fp32, bf16 -> fp32) made a plain FMA loop compute bound at 13-23 GB/s. The dot
// product instructions take the weights as they are stored. For the 16-bit activation formats, int16
// instead of bf16 activations halved the instructions per weight (bf16 needed the weights converted:
// int8 -> int32 -> fp32 -> bf16, or a table lookup per 32 int4 values): from cache 28 -> 54 G int8 and
// 44 -> 90 G int4 weights/s on Llama-2-7B's 11008 x 4096, from memory 24.5 -> 27 and 18.4 -> 21.8 GB/s.
//
// Registered as torch.ops.quantspec.*: no pybind11, so it compiles in seconds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>

#include "dispatch.h"
#include "simd.h"

namespace {

constexpr int kRows = 4;   // weight rows per block: 4 independent accumulator chains per x row
constexpr int kMaxM = 6;   // x rows per pass: 6 x 4 accumulators + 4 weight registers fit in 32
// Prefetch the next block's weights while this one is summed: on the head the hardware prefetcher
// alone left bf16 at 19-26 GB/s, with it 25-45 (a noisy host; 4 and 8 rows ahead measured alike).
constexpr int kAhead = kRows;

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
  V wv(const State&, int64_t n, int64_t k) const { return _mm512_loadu_ps(at(n, k)); }
  V xv(int m, int64_t k) const { return _mm512_loadu_ps(x_at(m, k)); }
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc madd(Acc a, V w, V x) { return _mm512_fmadd_ps(w, x, a); }
};

struct Bf16 : Dense<uint16_t, uint16_t> {  // 32 per step: bf16 pairs multiplied and summed into fp32 lanes
  using Acc = __m512; using V = __m512bh; static constexpr int kStep = 32;
  V wv(const State&, int64_t n, int64_t k) const { return (V)_mm512_loadu_si512(at(n, k)); }
  V xv(int m, int64_t k) const { return (V)_mm512_loadu_si512(x_at(m, k)); }
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc madd(Acc a, V w, V x) { return _mm512_dpbf16_ps(a, w, x); }
};

struct W8A8 : Dense<int8_t, uint8_t> {  // 64 per step: u8 activations (int8 + 128) x s8 weights into int32 lanes
  using Acc = __m512i; using V = __m512i; static constexpr int kStep = 64;
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
// holding values i, i + 32, i + 64 and i + 96 in its four nibbles, the layout `pack_w4` makes at load.
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
  const int16_t* x; int64_t K; const float* x_scale;
  V xv(int m, int64_t k) const { return _mm512_loadu_si512(x + m * K + k); }
  static Acc zero() { return _mm512_setzero_si512(); }
  static Acc madd(Acc a, V w, V x) { return _mm512_dpwssd_epi32(a, w, x); }
};

struct W8A16 : Int16X {  // 32 per step: int8 weights sign-extended to int16
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

// int4 in pack_w4's layout (see W4Unpack above): nibble u of each 16-bit lane, masked, is the weight q (0..15)
// as an int16. w = q * scale + offset per group: the int32 sum of q * x is scaled once per group, and
// the offsets meet the group sums of x (x_group) in `finish`.
struct W4A16 : Int16X {
  using State = float; static constexpr int kSub = 4;  // 4 steps of 32 per 64-byte load
  const uint8_t* w; const float* scale; const float* offset; const float* x_group; int64_t group;
  int64_t span() const { return group; }
  State begin(int64_t n, int64_t k) const { return scale[n * (K / group) + k / group]; }
  const void* at(int64_t n, int64_t k) const { return w + n * (K / 2) + k / 2; }
  V wv(const State&, int64_t n, int64_t k, int u) const {
    const __m512i v = _mm512_loadu_si512(at(n, k)), low = _mm512_set1_epi16(0xF);
    switch (u) {
      case 1: return _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      case 2: return _mm512_and_si512(_mm512_srli_epi16(v, 8), low);
      case 3: return _mm512_srli_epi16(v, 12);
      default: return _mm512_and_si512(v, low);
    }
  }
  static __m512 fold(__m512 sum, Acc a, const State& s) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(s), sum);
  }
  __m128 finish(__m128 sums, int64_t n, int m, int lanes) const {
    const int64_t G = K / group;
    alignas(16) float off[4] = {0, 0, 0, 0};
    for (int r = 0; r < lanes; ++r) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t g = 0; g < G; g += 16) {
        const __mmask16 k = G - g >= 16 ? 0xFFFF : (1 << (G - g)) - 1;
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, offset + (n + r) * G + g), _mm512_maskz_loadu_ps(k, x_group + m * G + g), acc);
      }
      off[r] = _mm512_reduce_add_ps(acc);
    }
    return _mm_mul_ps(_mm_add_ps(sums, _mm_load_ps(off)), _mm_set1_ps(x_scale[m]));
  }
};

// A format with kSub > 1 loads once per kSub steps and hands out one step's weights at a time.
template <typename F>
inline typename F::V weights(const F& f, const typename F::State& s, int64_t n, int64_t k, int u) {
  if constexpr (F::kSub > 1) return f.wv(s, n, k, u); else return f.wv(s, n, k);
}

template <typename T> inline void put(T* y, __m128 v, int lanes) {
  alignas(16) float f[4];
  _mm_store_ps(f, v);
  for (int i = 0; i < lanes; ++i) y[i] = static_cast<T>(f[i]);
}

template <typename F, typename = void> struct Folds { static constexpr bool value = false; };
template <typename F> struct Folds<F, std::void_t<decltype(F::kFolds)>> { static constexpr bool value = F::kFolds; };

// R weight rows from n0 against M rows of x, into y [M, N]. A folding format's int32 sums start afresh
// each span and are folded into fp32 sums at its end.
template <int M, int R, typename F, typename T>
inline void block(const F& f, int m0, int64_t n0, T* y, int64_t N) {
  constexpr bool folds = Folds<F>::value;
  using Sum = std::conditional_t<folds, __m512, typename F::Acc>;
  Sum sum[M][R];
  typename F::Acc acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) {
      if constexpr (folds) sum[m][r] = _mm512_setzero_ps(); else sum[m][r] = F::zero();
    }
  for (int64_t k0 = 0; k0 < f.K; k0 += f.span()) {
    const int64_t k1 = std::min(k0 + f.span(), f.K);
    typename F::State state[R];
    for (int r = 0; r < R; ++r) state[r] = f.begin(n0 + r, k0);
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) {
        if constexpr (folds) acc[m][r] = F::zero(); else acc[m][r] = sum[m][r];
      }
    constexpr int U = F::kSub;
    for (int64_t k = k0; k < k1; k += F::kStep * U) {
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(f.at(n0 + r + kAhead, k)), _MM_HINT_T0);
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        typename F::V wv[R];
        for (int r = 0; r < R; ++r) wv[r] = weights(f, state[r], n0 + r, k, u);
        for (int m = 0; m < M; ++m) {
          const typename F::V xv = f.xv(m0 + m, k + u * F::kStep);
          for (int r = 0; r < R; ++r) acc[m][r] = F::madd(acc[m][r], wv[r], xv);
        }
      }
    }
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) {
        if constexpr (folds) sum[m][r] = F::fold(sum[m][r], acc[m][r], state[r]); else sum[m][r] = acc[m][r];
      }
  }
  for (int m = 0; m < M; ++m) {
    if constexpr (R == 4) put(y + (m0 + m) * N + n0, f.finish(sum4(sum[m]), n0, m0 + m, 4), 4);
    else put(y + (m0 + m) * N + n0, f.finish(sum1(sum[m][0]), n0, m0 + m, 1), 1);
  }
}

template <int M, typename F, typename T>
void pass(const F& f, int m0, T* y, int64_t N) {
  const int64_t blocks = N / kRows;
  // 32 blocks (128 rows) per task at least: enough work to hide the hand-off between threads.
  at::parallel_for(0, blocks, 32, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) block<M, kRows>(f, m0, b * kRows, y, N);
  });
  for (int64_t n = blocks * kRows; n < N; ++n) block<M, 1>(f, m0, n, y, N);
}

template <typename F, typename T>
void gemv(const F& f, int64_t M, T* y, int64_t N) {
  for (int m0 = 0; m0 < M; m0 += kMaxM) {  // a second pass (M > 6) re-reads W, mostly from cache
    switch (std::min<int64_t>(M - m0, kMaxM)) {
      case 1: pass<1>(f, m0, y, N); break;
      case 2: pass<2>(f, m0, y, N); break;
      case 3: pass<3>(f, m0, y, N); break;
      case 4: pass<4>(f, m0, y, N); break;
      case 5: pass<5>(f, m0, y, N); break;
      default: pass<6>(f, m0, y, N); break;
    }
  }
}

template <typename F>
at::Tensor run(const F& f, int64_t M, int64_t N, const at::Tensor& like) {
  at::Tensor y = at::empty({M, N}, like.options());
  QUANTSPEC_DISPATCH_FLOAT_BF16(like.scalar_type(), "quantspec gemv", [&] { gemv(f, M, y.data_ptr<scalar_t>(), N); });
  return y;
}

void check(const at::Tensor& x, const at::Tensor& w, int64_t step, int64_t w_cols) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && w.is_contiguous(), "quantspec: x [M, K], weight contiguous [N, K]");
  TORCH_CHECK(x.size(1) % step == 0, "quantspec: K = ", x.size(1), " must be a multiple of ", step);
  TORCH_CHECK(w.size(1) == w_cols, "quantspec: weight has ", w.size(1), " columns, expected ", w_cols);
}

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<c10::BFloat16>()); }

at::Tensor gemv_float(const at::Tensor& x, const at::Tensor& w) {
  const int64_t K = x.size(1);
  if (w.scalar_type() == at::kFloat) {
    check(x, w, F32::kStep, K);
    at::Tensor xf = x.to(at::kFloat).contiguous();
    return run(F32{{w.data_ptr<float>(), xf.data_ptr<float>(), K}}, x.size(0), w.size(0), x);
  }
  TORCH_CHECK(w.scalar_type() == at::kBFloat16, "quantspec: float weight must be float32 or bfloat16");
  check(x, w, Bf16::kStep, K);
  at::Tensor xb = x.to(at::kBFloat16).contiguous();
  return run(Bf16{{bits(w), bits(xb), K}}, x.size(0), w.size(0), x);
}

// A row's quantization scale: max|x| (at least `floor`) over the integer range `qmax`. K: a multiple of 16.
inline float row_scale(const float* row, int64_t K, float qmax, float floor) {
  __m512 amax = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(row + k)));
  return std::max(_mm512_reduce_max_ps(amax), floor) / qmax;
}

// x rows quantized as qparams.int8_per_token does: scale = max|x| / 127, q = round-half-even(x / scale).
void quantize_rows(const at::Tensor& xf, uint8_t* q, float* scales) {
  const int64_t M = xf.size(0), K = xf.size(1);
  const float* x = xf.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    const float scale = row_scale(row, K, 127.f, 1e-8f);
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

// x rows quantized to int16: scale = max|x| / 32767, q = round-half-even(x / scale). With `group`,
// also each group's sum of q (for the int4 offsets), as float.
void quantize_rows16(const at::Tensor& xf, int16_t* q, float* scales, int64_t group, float* group_sums) {
  const int64_t M = xf.size(0), K = xf.size(1);
  const float* x = xf.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    const float scale = row_scale(row, K, 32767.f, 1e-30f);
    scales[m] = scale;
    const __m512 inv = _mm512_set1_ps(1.f / scale);
    __m512i gsum = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 16) {
      __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + k), inv));  // MXCSR: nearest-even
      v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(32767)), _mm512_set1_epi32(-32767));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + m * K + k), _mm512_cvtepi32_epi16(v));
      if (group_sums) {
        gsum = _mm512_add_epi32(gsum, v);
        if ((k + 16) % group == 0) {
          group_sums[m * (K / group) + k / group] = static_cast<float>(_mm512_reduce_add_epi32(gsum));
          gsum = _mm512_setzero_si512();
        }
      }
    }
  }
}

at::Tensor gemv_w8a8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale, const at::Tensor& w_sum) {
  const int64_t M = x.size(0), K = x.size(1);
  check(x, w, W8A8::kStep, K);
  TORCH_CHECK(w.scalar_type() == at::kChar && w_scale.scalar_type() == at::kFloat && w_sum.scalar_type() == at::kInt,
              "quantspec gemv_w8a8: int8 weight, float32 scale, int32 row sums");
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kByte));
  at::Tensor xs = at::empty({M}, x.options().dtype(at::kFloat));
  quantize_rows(xf, q.data_ptr<uint8_t>(), xs.data_ptr<float>());
  W8A8 f{{w.data_ptr<int8_t>(), q.data_ptr<uint8_t>(), K}, w_scale.contiguous().data_ptr<float>(),
         w_sum.contiguous().data_ptr<int32_t>(), xs.data_ptr<float>()};
  return run(f, M, w.size(0), x);
}

at::Tensor gemv_w8a16(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale) {
  const int64_t M = x.size(0), K = x.size(1);
  check(x, w, W8A16::kStep, K);
  TORCH_CHECK(w.scalar_type() == at::kChar && w_scale.scalar_type() == at::kFloat && w_scale.is_contiguous(),
              "quantspec gemv_w8a16: int8 weight, float32 scale");
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kShort));
  at::Tensor xs = at::empty({M}, x.options().dtype(at::kFloat));
  quantize_rows16(xf, q.data_ptr<int16_t>(), xs.data_ptr<float>(), 0, nullptr);
  W8A16 f;
  f.x = q.data_ptr<int16_t>(); f.K = K; f.x_scale = xs.data_ptr<float>();
  f.w = w.data_ptr<int8_t>(); f.w_scale = w_scale.data_ptr<float>();
  return run(f, M, w.size(0), x);
}

at::Tensor gemv_w4a16(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                      const at::Tensor& offset, int64_t group) {
  const int64_t M = x.size(0), K = x.size(1);
  check(x, packed, W4A16::kStep * W4A16::kSub, K / 2);
  TORCH_CHECK(packed.scalar_type() == at::kByte && group % 128 == 0 && K % group == 0,
              "quantspec gemv_w4a16: uint8 packed weight, group a multiple of 128 dividing K");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && offset.scalar_type() == at::kFloat && scale.is_contiguous() &&
              offset.is_contiguous(), "quantspec gemv_w4a16: float32 scale and offset [N, K / group]");
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kShort));
  at::Tensor xs = at::empty({M}, x.options().dtype(at::kFloat));
  at::Tensor sums = at::empty({M, K / group}, x.options().dtype(at::kFloat));
  quantize_rows16(xf, q.data_ptr<int16_t>(), xs.data_ptr<float>(), group, sums.data_ptr<float>());
  W4A16 f;
  f.x = q.data_ptr<int16_t>(); f.K = K; f.x_scale = xs.data_ptr<float>();
  f.w = packed.data_ptr<uint8_t>(); f.scale = scale.data_ptr<float>(); f.offset = offset.data_ptr<float>();
  f.x_group = sums.data_ptr<float>(); f.group = group;
  return run(f, M, packed.size(0), x);
}

// The whole int4 weight as bf16 [N, K], unpacked exactly as the kernel above unpacks it in registers:
// a prefill's many rows then take one bf16 GEMM (ATen's int4 kernel, whose time grows with the rows,
// took 8.6 s for 128 rows of Llama-2-7B).
at::Tensor dequant_w4a16(const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset, int64_t group) {
  const int64_t N = packed.size(0), K = packed.size(1) * 2;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && K % 128 == 0 && group % 128 == 0 &&
              K % group == 0, "quantspec dequant_w4a16: contiguous uint8 packed weight, K and group multiples of 128");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && offset.scalar_type() == at::kFloat && scale.is_contiguous() &&
              offset.is_contiguous(), "quantspec dequant_w4a16: float32 scale and offset [N, K / group]");
  at::Tensor out = at::empty({N, K}, packed.options().dtype(at::kBFloat16));
  const W4Unpack f{packed.data_ptr<uint8_t>(), K, scale.data_ptr<float>(), offset.data_ptr<float>(), group};
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t k0 = 0; k0 < K; k0 += group) {
        const __m512i table = f.table(n, k0);
        for (int64_t k = k0; k < k0 + group; k += 128)
          for (int u = 0; u < 4; ++u) _mm512_storeu_si512(o + n * K + k + 32 * u, f.bf16(table, n, k, u));
      }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(quantspec, m) {
  m.def("dequant_w4a16(Tensor packed, Tensor scale, Tensor offset, int group) -> Tensor");
  m.def("gemv_float(Tensor x, Tensor w) -> Tensor");
  m.def("gemv_w8a8(Tensor x, Tensor w, Tensor w_scale, Tensor w_sum) -> Tensor");
  m.def("gemv_w8a16(Tensor x, Tensor w, Tensor w_scale) -> Tensor");
  m.def("gemv_w4a16(Tensor x, Tensor packed, Tensor scale, Tensor offset, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(quantspec, CPU, m) {
  m.impl("gemv_float", gemv_float);
  m.impl("gemv_w8a8", gemv_w8a8);
  m.impl("gemv_w8a16", gemv_w8a16);
  m.impl("gemv_w4a16", gemv_w4a16);
  m.impl("dequant_w4a16", dequant_w4a16);
}
