// The two activation dtypes quantspec's kernels run, through ATen's own dispatch (scalar_t inside):
// float32 and bfloat16, anything else refused with ATen's "not implemented for" error.
#pragma once

#include <ATen/Dispatch.h>

#define QUANTSPEC_DISPATCH_FLOAT_BF16(TYPE, NAME, ...)       \
  AT_DISPATCH_SWITCH(TYPE, NAME,                              \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))
