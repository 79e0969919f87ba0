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

namespace {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

template <typename T>
void attend(const T* q, const T* k, const T* v, int64_t head_stride, T* out, int64_t H, int64_t KVH, int64_t Q,
            int64_t L, int64_t D, float scale) {
  const int64_t group = H / KVH;
  at::parallel_for(0, H * Q, 1, [&](int64_t b, int64_t e) {
    std::vector<float> qf(D), acc(D), scores(L);
    for (int64_t item = b; item < e; ++item) {
      const int64_t h = item / Q, i = item % Q, n = L - Q + i + 1;
      const T* kh = k + (h / group) * head_stride;
      const T* vh = v + (h / group) * head_stride;
      for (int64_t d = 0; d < D; ++d) qf[d] = float(q[item * D + d]);
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        __m512 s = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(&qf[d]), load16(kh + j * D + d), s);
        scores[j] = _mm512_reduce_add_ps(s) * scale;
        best = std::max(best, scores[j]);
      }
      float total = 0.f;
      for (int64_t j = 0; j < n; ++j) total += (scores[j] = std::exp(scores[j] - best));
      for (int64_t d = 0; d < D; d += 16) {
        __m512 a = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; ++j) a = _mm512_fmadd_ps(_mm512_set1_ps(scores[j]), load16(vh + j * D + d), a);
        _mm512_storeu_ps(&acc[d], _mm512_div_ps(a, _mm512_set1_ps(total)));
      }
      for (int64_t d = 0; d < D; ++d) out[item * D + d] = T(acc[d]);
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
    attend(qc.data_ptr<scalar_t>(), kc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(), kc.stride(1),
           out.data_ptr<scalar_t>(), H, KVH, Q, L, D, float(scale));
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
