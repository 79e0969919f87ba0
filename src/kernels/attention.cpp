// Attention for a few new queries over a KV cache, each query row computed on its own, in a fixed
// order: a query's output is bit-for-bit the same whether it arrives alone (a decode step) or among
// k others (verifying a draft). SDPA picks different kernels for 1 and k queries (and a mask for k),
// and in bf16 the rounding differences flipped near-tied greedy choices: speculative decoding then
// did not reproduce plain decoding's output. Also lighter than SDPA's dispatch for one query.
//
//   q [1, H, Q, D], k/v [1, KVH, L, D] (the cache, new keys last), H a multiple of KVH (GQA). k and v
//   may be views of a longer buffer (src/engine/kvcache.py): rows of D contiguous values, heads any
//   stride apart, read in place.
//   Query i sees keys 0 .. L - Q + i (causal, bottom-right aligned). fp32 softmax and sums.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

#include "dispatch.h"
#include "simd.h"

namespace {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
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
            int64_t L, float scale) {
  constexpr int64_t D = DB * 16;
  const int64_t group = H / KVH;
  at::parallel_for(0, H * Q, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores(L + 16);
    for (int64_t item = b; item < e; ++item) {
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
        for (int l = 0; l < 16; ++l) out[item * D + 16 * d + l] = T(row[l]);
      }
    }
  });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(0) == 1, "quantspec attention: [1, H, Q, D]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "quantspec attention: one dtype for q, k and v");
  const int64_t H = q.size(1), Q = q.size(2), D = q.size(3), KVH = k.size(1), L = k.size(2);
  TORCH_CHECK(H % KVH == 0 && D % 16 == 0 && Q <= L && k.sizes() == v.sizes() && k.size(3) == D,
              "quantspec attention: heads a multiple of KV heads, head dim a multiple of 16, Q <= L");
  // The cache's own memory where its rows are contiguous and k, v share a layout; a copy otherwise.
  const bool in_place = k.stride(3) == 1 && k.stride(2) == D && k.strides() == v.strides();
  const at::Tensor qc = q.contiguous(), kc = in_place ? k : k.contiguous(), vc = in_place ? v : v.contiguous();
  at::Tensor out = at::empty_like(qc);
  QUANTSPEC_DISPATCH_FLOAT_BF16(q.scalar_type(), "quantspec::decode_attention", [&] {
    const scalar_t *qp = qc.data_ptr<scalar_t>(), *kp = kc.data_ptr<scalar_t>(), *vp = vc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    switch (D / 16) {  // the head dims of the models quantspec runs (tiny ones included)
      case 1: attend<1>(qp, kp, vp, kc.stride(1), op, H, KVH, Q, L, float(scale)); break;
      case 2: attend<2>(qp, kp, vp, kc.stride(1), op, H, KVH, Q, L, float(scale)); break;
      case 4: attend<4>(qp, kp, vp, kc.stride(1), op, H, KVH, Q, L, float(scale)); break;
      case 8: attend<8>(qp, kp, vp, kc.stride(1), op, H, KVH, Q, L, float(scale)); break;
      case 16: attend<16>(qp, kp, vp, kc.stride(1), op, H, KVH, Q, L, float(scale)); break;
      default: TORCH_CHECK(false, "quantspec attention: head dim ", D, " is not 16, 32, 64, 128 or 256");
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quantspec, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(quantspec, CPU, m) {
  m.impl("decode_attention", decode_attention);
}
