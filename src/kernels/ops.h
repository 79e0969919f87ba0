// The torch-side kernel calls (binding.cpp) that the C++ step loop (step.cpp) calls directly, without
// the dispatcher: each checks its tensors and splits N across ATen's threads as torch.ops.quantspec.* do,
// so a step through step.cpp computes what the Python step path computes, operation for operation.
#pragma once

// The ATen headers of what this file uses, not ATen/ATen.h (why: binding.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "core/api.h"

namespace qs_ops {

const qs_kernels& k();  // the variant in use (TORCH_CHECK if none)

at::Tensor gemv_float(const at::Tensor& x, const at::Tensor& w);
at::Tensor gemv_w8a8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale, const at::Tensor& w_sum);
at::Tensor gemv_w8a16(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale);
at::Tensor gemv_w4a8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset,
                     int64_t group);

}  // namespace qs_ops
