// RMSNorm in one call, for the two conventions of the models quantspec runs. A decode step makes
// ~110 norm calls on Gemma 3 270M, each 8 ATen ops in transformers (float cast, pow, mean, add,
// rsqrt, mul, weight + 1, cast): ~2-3 ms a step of dispatch, for 640 numbers a call.
//   gemma: y = (x_f32 * r * (1 + w_f32)).to(x.dtype)          (Gemma3RMSNorm)
//   llama: y = w * (x_f32 * r).to(x.dtype), in w's dtype     (LlamaRMSNorm, Qwen2RMSNorm)
// with r = 1 / sqrt(mean(x_f32^2) + eps). Rows run in parallel (prefill has many).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "dispatch.h"

#include <cmath>

namespace {

template <typename T, typename W>
void norm_rows(const T* x, const W* w, T* y, int64_t rows, int64_t d, double eps, bool gemma) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * d;
      T* yr = y + r * d;
      float ss = 0.f;
      for (int64_t i = 0; i < d; ++i) ss += float(xr[i]) * float(xr[i]);
      const float inv = 1.f / std::sqrt(ss / float(d) + float(eps));
      if (gemma) {
        for (int64_t i = 0; i < d; ++i) yr[i] = T(float(xr[i]) * inv * (1.f + float(w[i])));
      } else {
        for (int64_t i = 0; i < d; ++i) yr[i] = T(float(W(T(float(xr[i]) * inv))) * float(w[i]));
      }
    }
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool gemma) {
  TORCH_CHECK(x.size(-1) == weight.numel(), "quantspec rms_norm: weight size differs from the last dim");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "quantspec rms_norm: x and weight dtypes differ");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor y = at::empty_like(xc);
  const int64_t d = x.size(-1), rows = xc.numel() / d;
  QUANTSPEC_DISPATCH_FLOAT_BF16(x.scalar_type(), "quantspec::rms_norm", [&] {
    norm_rows(xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), rows, d, eps, gemma);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quantspec, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, bool gemma) -> Tensor");
}

TORCH_LIBRARY_IMPL(quantspec, CPU, m) {
  m.impl("rms_norm", rms_norm);
}
