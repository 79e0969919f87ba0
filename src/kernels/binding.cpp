// The torch side of quantspec's kernels: torch.ops.quantspec.* check their tensors, split the work across
// ATen's threads, and call the kernel variant chosen for this CPU (core/api.h), loaded with dlopen by
// use_variant(path, fallbacks). The variants know nothing of torch; this file knows nothing of any ISA.
// The ATen headers of what this file uses, not ATen/ATen.h (every operator): the binding builds in ~45 s of CPU,
// not ~60 (measured side by side, x86-64, g++ 12), on a user's first run and in every rebuild.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/amx.h"
#include "core/api.h"
#include "core/common.h"
#include "ops.h"

namespace {

const qs_kernels* g_kernels = nullptr;   // the variant in use (one per process: use_variant switches it)
std::map<std::string, qs_kernels> g_loaded;  // each variant's table, its missing grouped kernels filled in
std::mutex g_mutex;

const qs_kernels* open_table(const std::string& path) {
  // RTLD_LOCAL: each variant keeps its own copies of inline code, compiled for its own ISA.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(handle, "quantspec: cannot load kernel variant ", path, ": ", dlerror());
  auto get = reinterpret_cast<const qs_kernels* (*)()>(dlsym(handle, "qs_kernels_get"));
  TORCH_CHECK(get, "quantspec: ", path, " is no kernel variant (no qs_kernels_get)");
  const qs_kernels* table = get();
  TORCH_CHECK(table->abi == QS_ABI, "quantspec: ", path, " has kernel ABI ", table->abi, ", expected ", QS_ABI);
  return table;
}

// The variant at `path`, each grouped format it has no kernel for taken from the first of `fallbacks` (the
// variants below it that this CPU runs, best first, the reference variant last) that has one: ggml-cpu's
// arch-fallback, at load. A new format runs everywhere once its reference kernel exists, and an AVX-512 host
// runs AVX2's kernel for a format the AVX-512 variant has none of, not the reference's loops.
std::string use_variant(const std::string& path, const std::vector<std::string>& fallbacks) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto found = g_loaded.find(path);
  if (found == g_loaded.end()) {
    qs_kernels table = *open_table(path);
    for (const std::string& other : fallbacks) {
      const qs_kernels* below = other == path ? &table : open_table(other);
      for (int f = 0; f < QS_FORMAT_COUNT; ++f) {
        if (!table.gemv_grouped[f]) table.gemv_grouped[f] = below->gemv_grouped[f];
        if (!table.dequant_grouped[f]) table.dequant_grouped[f] = below->dequant_grouped[f];
      }
    }
    found = g_loaded.emplace(path, table).first;
  }
  g_kernels = &found->second;
  return g_kernels->name;
}

// The formats' names by number (api.h's QS_FORMATS): src.quant.formats finds a format's number here.
std::vector<std::string> formats() {
#define QS_FORMAT_NAME(id, name, bits) name,
  return {QS_FORMATS(QS_FORMAT_NAME)};
#undef QS_FORMAT_NAME
}

std::string variant() { return g_kernels ? g_kernels->name : ""; }

const qs_amx* g_amx = nullptr;  // the AMX library, once Linux has granted the tile state (amx.h)

// "" once the AMX library at `path` is in use, else why not (Linux's refusal of the tile state, in its words).
std::string use_amx(const std::string& path, int64_t feature) {
  std::lock_guard<std::mutex> lock(g_mutex);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(handle, "quantspec: cannot load the AMX kernels ", path, ": ", dlerror());
  auto get = reinterpret_cast<const qs_amx* (*)()>(dlsym(handle, "qs_amx_get"));
  TORCH_CHECK(get && get()->abi == QS_AMX_ABI, "quantspec: ", path, " is no AMX library of ABI ", QS_AMX_ABI);
  const int refused = get()->request(int(feature));
  if (refused != 0) return std::string("Linux refused the AMX tile state (arch_prctl: ") + strerror(refused) + ")";
  g_amx = get();
  return "";
}

bool amx() { return g_amx != nullptr; }

}  // namespace

namespace qs_ops {

const qs_kernels& k() {
  TORCH_CHECK(g_kernels, "quantspec: no kernel variant loaded (src.kernels.load chooses one)");
  return *g_kernels;
}

namespace {

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<c10::BFloat16>()); }
uint16_t* bits_out(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<c10::BFloat16>()); }

void check(const at::Tensor& x, const at::Tensor& w, int64_t step, int64_t w_cols) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && w.is_contiguous(), "quantspec: x [M, K], weight contiguous [N, K]");
  TORCH_CHECK(x.size(1) % step == 0, "quantspec: K = ", x.size(1), " must be a multiple of ", step);
  TORCH_CHECK(w.size(1) == w_cols, "quantspec: weight has ", w.size(1), " columns, expected ", w_cols);
}

// y [M, N] by slices of output rows across threads: whole blocks of 4 (a row's sum then never depends
// on where a thread's slice starts), each thread's slice in pieces of ~256 KB of weights so that a
// second pass over x's rows (more rows than a variant keeps in registers) re-reads W from cache.
// A bf16 caller gets bf16 y, each piece rounded while it is in cache (torch's rounding, qs::f32_to_bf16)
// rather than by a separate pass and op call after.
template <typename Call>
at::Tensor columns(int64_t M, int64_t N, int64_t row_bytes, const at::Tensor& like, Call call) {
  at::Tensor y = at::empty({M, N}, like.options().dtype(at::kFloat));
  const bool bf16 = like.scalar_type() == at::kBFloat16;
  at::Tensor yb = bf16 ? at::empty({M, N}, like.options().dtype(at::kBFloat16)) : y;
  float* out = y.data_ptr<float>();
  uint16_t* outb = bf16 ? bits_out(yb) : nullptr;
  const int64_t blocks = (N + 3) / 4;
  const int64_t piece = std::max<int64_t>(1, (256 << 10) / std::max<int64_t>(1, 4 * row_bytes));
  at::parallel_for(0, blocks, 32, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b += piece) {
      const int64_t n0 = 4 * b, n1 = std::min(4 * std::min(b + piece, b1), N);
      call(n0, n1, out);
      if (bf16)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = n0; n < n1; ++n) outb[m * N + n] = qs::f32_to_bf16(out[m * N + n]);
    }
  });
  return bf16 || like.scalar_type() == at::kFloat ? yb : y.to(like.scalar_type());
}

}  // namespace

at::Tensor gemv_float(const at::Tensor& x, const at::Tensor& w) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "quantspec: x float32 or bfloat16");
  if (w.scalar_type() == at::kFloat) {
    check(x, w, 16, K);
    const at::Tensor xf = x.to(at::kFloat).contiguous();
    const float *xp = xf.data_ptr<float>(), *wp = w.data_ptr<float>();
    return columns(M, N, 4 * K, x, [&](int64_t n0, int64_t n1, float* y) { k().gemv_f32(xp, wp, M, K, N, n0, n1, y); });
  }
  TORCH_CHECK(w.scalar_type() == at::kBFloat16, "quantspec: float weight must be float32 or bfloat16");
  check(x, w, 32, K);
  const at::Tensor xb = x.to(at::kBFloat16).contiguous();
  const uint16_t *xp = bits(xb), *wp = bits(w);
  return columns(M, N, 2 * K, x, [&](int64_t n0, int64_t n1, float* y) { k().gemv_bf16(xp, wp, M, K, N, n0, n1, y); });
}

at::Tensor gemv_w8a8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale, const at::Tensor& w_sum) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check(x, w, 64, K);
  TORCH_CHECK(w.scalar_type() == at::kChar && w_scale.scalar_type() == at::kFloat && w_sum.scalar_type() == at::kInt &&
              w_scale.is_contiguous() && w_sum.is_contiguous(),
              "quantspec gemv_w8a8: int8 weight (|w| <= 127), float32 scale, int32 row sums");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = at::empty({M, K * k().x8_bytes}, x.options().dtype(at::kByte));
  at::Tensor xs = at::empty({M}, x.options().dtype(at::kFloat));
  k().quantize_x8(xf.data_ptr<float>(), M, K, q.data_ptr<uint8_t>(), xs.data_ptr<float>());
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const float *xsp = xs.data_ptr<float>(), *wsp = w_scale.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const int32_t* sp = w_sum.data_ptr<int32_t>();
  return columns(M, N, K, x, [&](int64_t n0, int64_t n1, float* y) {
    k().gemv_w8a8(qp, xsp, wp, wsp, sp, M, K, N, n0, n1, y);
  });
}

at::Tensor gemv_w8a16(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check(x, w, 32, K);
  TORCH_CHECK(w.scalar_type() == at::kChar && w_scale.scalar_type() == at::kFloat && w_scale.is_contiguous(),
              "quantspec gemv_w8a16: int8 weight, float32 scale");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kShort));
  at::Tensor xs = at::empty({M}, x.options().dtype(at::kFloat));
  k().quantize_x16(xf.data_ptr<float>(), M, K, 0, q.data_ptr<int16_t>(), xs.data_ptr<float>(), nullptr);
  const int16_t* qp = q.data_ptr<int16_t>();
  const float *xsp = xs.data_ptr<float>(), *wsp = w_scale.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  return columns(M, N, K, x, [&](int64_t n0, int64_t n1, float* y) { k().gemv_w8a16(qp, xsp, wp, wsp, M, K, N, n0, n1, y); });
}

// A grouped format's packed weight (api.h): its bits, or a clear refusal of a format no kernel has.
int64_t grouped_bits(int64_t format, const char* op) {
  TORCH_CHECK(format >= 0 && format < QS_FORMAT_COUNT && k().gemv_grouped[format] && k().dequant_grouped[format],
              "quantspec ", op, ": format ", format, " has no grouped kernel");
  return qs_format_bits(int(format));
}

at::Tensor gemv_grouped(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                        const at::Tensor& offset, int64_t group, int64_t format) {
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0), bits = grouped_bits(format, "gemv_grouped");
  check(x, packed, 128, K * bits / 8);
  TORCH_CHECK(packed.scalar_type() == at::kByte && group % 128 == 0 && K % group == 0,
              "quantspec gemv_grouped: uint8 packed weight, group a multiple of 128 dividing K");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && offset.scalar_type() == at::kFloat && scale.is_contiguous() &&
              offset.is_contiguous(), "quantspec gemv_grouped: float32 scale and offset [N, K / group]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kShort));
  at::Tensor xs = at::empty({M}, x.options().dtype(at::kFloat));
  at::Tensor sums = at::empty({M, K / group}, x.options().dtype(at::kFloat));
  k().quantize_x16(xf.data_ptr<float>(), M, K, group, q.data_ptr<int16_t>(), xs.data_ptr<float>(), sums.data_ptr<float>());
  const int16_t* qp = q.data_ptr<int16_t>();
  const float *xsp = xs.data_ptr<float>(), *gp = sums.data_ptr<float>(), *sp = scale.data_ptr<float>(),
              *op = offset.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const auto kernel = k().gemv_grouped[format];
  return columns(M, N, K * bits / 8, x, [&](int64_t n0, int64_t n1, float* y) {
    kernel(qp, xsp, gp, wp, sp, op, group, M, K, N, n0, n1, y);
  });
}

at::Tensor gemv_w4a8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset,
                     int64_t group) {
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0);
  check(x, packed, 128, K / 2);
  TORCH_CHECK(packed.scalar_type() == at::kByte && group % 128 == 0 && K % group == 0,
              "quantspec gemv_w4a8: uint8 packed weight, group a multiple of 128 dividing K");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && offset.scalar_type() == at::kFloat && scale.is_contiguous() &&
              offset.is_contiguous(), "quantspec gemv_w4a8: float32 scale and offset [N, K / group]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor xs = at::empty({M}, x.options().dtype(at::kFloat));
  at::Tensor sums = at::empty({M, K / group}, x.options().dtype(at::kFloat));
  k().quantize_x8_w4(xf.data_ptr<float>(), M, K, group, q.data_ptr<int8_t>(), xs.data_ptr<float>(), sums.data_ptr<float>());
  const int8_t* qp = q.data_ptr<int8_t>();
  const float *xsp = xs.data_ptr<float>(), *gp = sums.data_ptr<float>(), *sp = scale.data_ptr<float>(),
              *op = offset.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  return columns(M, N, K / 2, x, [&](int64_t n0, int64_t n1, float* y) {
    k().gemv_w4a8(qp, xsp, gp, wp, sp, op, group, M, K, N, n0, n1, y);
  });
}

// w8a8 for many rows on AMX's tiles (amx.h): x quantized per row to int8 as qparams.int8_per_token does, then
// y = float(x_q . w^T) * x_scale * w_scale, bit for bit the ATen path's (src.quant.prefill).
at::Tensor int8_gemm_amx(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale) {
  TORCH_CHECK(g_amx, "quantspec: the AMX kernels are not in use (src.kernels.amx.enable)");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check(x, w, 64, K);
  TORCH_CHECK(w.scalar_type() == at::kChar && w_scale.scalar_type() == at::kFloat && w_scale.is_contiguous(),
              "quantspec int8_gemm_amx: int8 weight, float32 scale");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = at::empty({g_amx->tiles_bytes(M, K)}, x.options().dtype(at::kChar));
  at::Tensor xs = at::empty({M}, x.options().dtype(at::kFloat));
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
  const float* xp = xf.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float *xsp = xs.data_ptr<float>(), *yp = y.data_ptr<float>();
  const int64_t padded = q.numel() / K;
  at::parallel_for(0, padded / 16, 1, [&](int64_t b0, int64_t b1) {
    g_amx->quantize_x8_tiles(xp, M, K, 16 * b0, 16 * b1, qp, xsp);
  });
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* wsp = w_scale.data_ptr<float>();
  at::parallel_for(0, (N + 31) / 32, 1, [&](int64_t p0, int64_t p1) {
    g_amx->gemm_s8(qp, xsp, wp, wsp, M, K, N, 32 * p0, std::min(32 * p1, N), yp);
  });
  return y;
}

// w4a8's prefill: bf16 x [M, K] quantized per row to int8 values held as bf16 (q, and x_scale float [M, 1]),
// qparams.int8_per_token's values in one pass.
std::tuple<at::Tensor, at::Tensor> quantize_x8_bf16(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.size(1) % 128 == 0,
              "quantspec quantize_x8_bf16: bf16 x [M, K], K a multiple of 128");
  const at::Tensor xc = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options());
  at::Tensor xs = at::empty({M, 1}, x.options().dtype(at::kFloat));
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    k().quantize_x8_bf16(bits(xc), K, r0, r1, bits_out(q), xs.data_ptr<float>());
  });
  return {q, xs};
}

// bf16 y [M, N] *= x_scale [M, 1] row by row, rounded to bf16 (in place; returns y).
at::Tensor scale_rows_bf16(at::Tensor y, const at::Tensor& x_scale) {
  TORCH_CHECK(y.dim() == 2 && y.scalar_type() == at::kBFloat16 && y.is_contiguous() &&
              x_scale.scalar_type() == at::kFloat && x_scale.is_contiguous() && x_scale.numel() == y.size(0),
              "quantspec scale_rows_bf16: contiguous bf16 y [M, N], float32 x_scale [M]");
  const int64_t N = y.size(1);
  at::parallel_for(0, y.size(0), 16, [&](int64_t r0, int64_t r1) {
    k().scale_rows_bf16(bits_out(y), N, x_scale.data_ptr<float>(), r0, r1);
  });
  return y;
}

// The whole of a grouped weight as bf16 [N, K], for a prefill's GEMM.
at::Tensor dequant_grouped(const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset, int64_t group,
                           int64_t format) {
  const int64_t bits = grouped_bits(format, "dequant_grouped");
  const int64_t N = packed.size(0), K = packed.size(1) * 8 / bits;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && K % 128 == 0 && group % 128 == 0 &&
              K % group == 0, "quantspec dequant_grouped: contiguous uint8 packed weight, K and group multiples of 128");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && offset.scalar_type() == at::kFloat && scale.is_contiguous() &&
              offset.is_contiguous(), "quantspec dequant_grouped: float32 scale and offset [N, K / group]");
  at::Tensor out = at::empty({N, K}, packed.options().dtype(at::kBFloat16));
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const float *sp = scale.data_ptr<float>(), *op = offset.data_ptr<float>();
  uint16_t* o = bits_out(out);
  const auto kernel = k().dequant_grouped[format];
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { kernel(wp, sp, op, group, K, n0, n1, o); });
  return out;
}

// Many rows on int8 activations (api.h): bf16 x [M, K] quantized per block of 128 values, as (q int8 [M, K],
// xs float [M, K / 128], xo float [M, K / 128]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_x8_blocks(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.size(1) % 128 == 0,
              "quantspec quantize_x8_blocks: bf16 x [M, K], K a multiple of 128");
  const at::Tensor xc = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor xs = at::empty({M, K / 128}, x.options().dtype(at::kFloat)), xo = at::empty_like(xs);
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    k().quantize_x8_blocks(bits(xc), K, r0, r1, q.data_ptr<int8_t>(), xs.data_ptr<float>(), xo.data_ptr<float>());
  });
  return {q, xs, xo};
}

// Whether the variant in use has its own int8-activation GEMM for this grouped format (api.h: not filled from below).
bool has_gemm_grouped_x8(int64_t format) {
  return format >= 0 && format < QS_FORMAT_COUNT && k().gemm_grouped_x8[format] != nullptr;
}

// bf16 x [M, K] times a grouped weight on int8 activations (api.h's gemm_grouped_x8): float32 y [M, N], by panels
// of 32 output columns across threads (each thread unpacks its own panels once).
at::Tensor gemm_grouped_x8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                           const at::Tensor& offset, int64_t group, int64_t format) {
  TORCH_CHECK(has_gemm_grouped_x8(format), "quantspec gemm_grouped_x8: the ", k().name, " kernels have none for format ",
              format, " (has_gemm_grouped_x8 says which do)");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0), bits = qs_format_bits(int(format));
  check(x, packed, 128, K * bits / 8);
  TORCH_CHECK(packed.scalar_type() == at::kByte && group % 128 == 0 && K % group == 0,
              "quantspec gemm_grouped_x8: uint8 packed weight, group a multiple of 128 dividing K");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && offset.scalar_type() == at::kFloat && scale.is_contiguous() &&
              offset.is_contiguous() && scale.numel() == N * (K / group) && offset.numel() == N * (K / group),
              "quantspec gemm_grouped_x8: float32 scale and offset [N, K / group]");
  auto [q, xs, xo] = quantize_x8_blocks(x.to(at::kBFloat16));
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
  const int8_t* qp = q.data_ptr<int8_t>();
  const float *xsp = xs.data_ptr<float>(), *xop = xo.data_ptr<float>(), *sp = scale.data_ptr<float>(),
              *op = offset.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const auto kernel = k().gemm_grouped_x8[format];
  at::parallel_for(0, (N + 31) / 32, 1, [&](int64_t p0, int64_t p1) {
    kernel(qp, xsp, xop, wp, sp, op, group, M, K, N, 32 * p0, std::min(32 * p1, N), yp);
  });
  return y;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool gemma) {
  TORCH_CHECK(x.size(-1) == weight.numel(), "quantspec rms_norm: weight size differs from the last dim");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "quantspec rms_norm: x and weight dtypes differ");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "quantspec rms_norm: float32 or bfloat16");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor y = at::empty_like(xc);
  const int64_t d = x.size(-1), rows = xc.numel() / d;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    if (bf16) k().rms_norm_bf16(bits(xc), bits(wc), d, float(eps), gemma, r0, r1, bits_out(y));
    else k().rms_norm_f32(xc.data_ptr<float>(), wc.data_ptr<float>(), d, float(eps), gemma, r0, r1, y.data_ptr<float>());
  });
  return y;
}

// q [1, H, Q, D], k/v [1, KVH, L, D] (the cache, new keys last; views of a longer buffer are read in place
// where rows of D are contiguous). Query i sees keys 0 .. L - Q + i. Each query on its own: a query's
// output is bit for bit the same alone (a decode step) or among k others (verifying a draft), which
// SDPA's kernels (different for 1 and k queries) do not give in bf16.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value, double scale) {
  TORCH_CHECK(q.dim() == 4 && key.dim() == 4 && value.dim() == 4 && q.size(0) == 1, "quantspec attention: [1, H, Q, D]");
  TORCH_CHECK(q.scalar_type() == key.scalar_type() && key.scalar_type() == value.scalar_type() &&
              (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "quantspec attention: one dtype for q, k and v, float32 or bfloat16");
  const int64_t H = q.size(1), Q = q.size(2), D = q.size(3), KVH = key.size(1), L = key.size(2);
  TORCH_CHECK(H % KVH == 0 && Q <= L && key.sizes() == value.sizes() && key.size(3) == D,
              "quantspec attention: heads a multiple of KV heads, Q <= L");
  TORCH_CHECK(D == 16 || D == 32 || D == 64 || D == 128 || D == 256,
              "quantspec attention: head dim ", D, " is not 16, 32, 64, 128 or 256");
  const bool in_place = key.stride(3) == 1 && key.stride(2) == D && key.strides() == value.strides();
  const at::Tensor qc = q.contiguous(), kc = in_place ? key : key.contiguous(), vc = in_place ? value : value.contiguous();
  at::Tensor out = at::empty_like(qc);
  const int64_t hs = kc.stride(1);
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  at::parallel_for(0, H * Q, 1, [&](int64_t i0, int64_t i1) {
    if (bf16) k().attention_bf16(bits(qc), bits(kc), bits(vc), hs, H, KVH, Q, L, D, float(scale), i0, i1, bits_out(out));
    else k().attention_f32(qc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(), hs, H, KVH, Q, L, D,
                           float(scale), i0, i1, out.data_ptr<float>());
  });
  return out;
}

namespace {

// torch.clamp(v, a, b) for values that are not NaN, in a form the compiler vectorizes
inline float clamp_to(float v, float a, float b) {
  v = v < a ? a : v;
  return v > b ? b : v;
}

// nearbyint under the default rounding mode (ties to even, as torch.round) for |u| < 2^22, vectorizable: the sum
// with 1.5 * 2^23 has no fraction bits, so the FPU's own rounding makes it an integer (without -ffast-math the
// compiler may not fold the two operations away). Clamped after to a range inside +-2^22 (a few bits' levels), as
// its callers do, it is nearbyint then the clamp for every value but NaN: beyond 2^22 both clamp to the same end.
inline float round_even(float u) {
  const float magic = 12582912.0f;
  return (u + magic) - magic;
}

// One feature of gptq_features, rows [r0, r1): rounded on its grid, its q stored, its error kept. Vectorized (the
// rows are independent): std::nearbyint and std::min/max had kept this loop scalar.
template <bool grouped, typename Q>
inline void round_feature(const float* x, const float* x0, const float* s, const float* l, float lowest,
                          float highest, Q* q, float* e, int64_t r0, int64_t r1) {
#pragma omp simd
  for (int64_t r = r0; r < r1; ++r) {
    const float u = clamp_to(round_even(grouped ? (x[r] - l[r]) / s[r] : x[r] / s[r]), lowest, highest);
    float back = u * s[r];
    if (grouped) back = back + l[r];
    q[r] = static_cast<Q>(u);
    e[r] = x0[r] - back;
  }
}

}  // namespace

// GPTQ's rounding of one run of features [c0, c1) of transposed float32 weights wt [K, n] (one feature's n
// weights contiguous), last to first, in place (src/quant/gptq.py's _round_rows says the algorithm, and runs these
// same float operations in torch where this binding is not loaded: the file builds with -ffp-contract=off, so each
// product and sum is rounded as torch rounds it, and the two give the same bits). Grouped: q = round((x - lo) / s)
// in 0..top, back = q * s + lo; else int8: q = round(x / s) in -top..top, back = q * s. Each feature's error, its
// original weight (w0t, as wt before any update) less back, goes to the run's earlier features j (weighted by the
// unit upper factor's factor[j, f]) and to err [c1 - b0 rows, n] at f - b0.
// Rows (output channels) are independent: split across ATen's threads, each run of rows in cache.
void gptq_features(at::Tensor& wt, const at::Tensor& w0t, const at::Tensor& factor, at::Tensor& qt, at::Tensor& err,
                   const at::Tensor& lo, const at::Tensor& scale, int64_t c0, int64_t c1, int64_t b0, int64_t top,
                   bool grouped) {
  TORCH_CHECK(wt.dim() == 2 && wt.scalar_type() == at::kFloat && wt.is_contiguous() &&
                  w0t.scalar_type() == at::kFloat && w0t.is_contiguous() && factor.scalar_type() == at::kFloat &&
                  factor.is_contiguous() && err.scalar_type() == at::kFloat && err.is_contiguous() &&
                  qt.is_contiguous() && scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
                  lo.scalar_type() == at::kFloat && lo.is_contiguous(),
              "quantspec gptq_features: contiguous float32 tensors");
  const int64_t n = wt.size(1), K = factor.size(0);
  TORCH_CHECK(0 <= b0 && b0 <= c0 && c0 < c1 && c1 <= wt.size(0) && w0t.sizes() == wt.sizes() &&
                  scale.numel() == n && lo.numel() == n && qt.size(1) == n && err.size(1) == n,
              "quantspec gptq_features: shapes");
  const bool unsigned_q = qt.scalar_type() == at::kByte;
  TORCH_CHECK(unsigned_q || qt.scalar_type() == at::kChar, "quantspec gptq_features: uint8 or int8 q");
  float* w = wt.data_ptr<float>();
  const float *w0 = w0t.data_ptr<float>(), *v = factor.data_ptr<float>(), *s = scale.data_ptr<float>(),
              *l = lo.data_ptr<float>();
  float* e_out = err.data_ptr<float>();
  const float lowest = grouped ? 0.0f : -float(top), highest = float(top);
  uint8_t* q8u = unsigned_q ? qt.data_ptr<uint8_t>() : nullptr;
  int8_t* q8s = unsigned_q ? nullptr : qt.data_ptr<int8_t>();
  at::parallel_for(0, n, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t f = c1 - 1; f >= c0; --f) {
      float* x = w + f * n;
      const float* x0 = w0 + f * n;
      float* e = e_out + (f - b0) * n;
      if (grouped && unsigned_q) round_feature<true>(x, x0, s, l, lowest, highest, q8u + f * n, e, r0, r1);
      else if (unsigned_q) round_feature<false>(x, x0, s, l, lowest, highest, q8u + f * n, e, r0, r1);
      else if (grouped) round_feature<true>(x, x0, s, l, lowest, highest, q8s + f * n, e, r0, r1);
      else round_feature<false>(x, x0, s, l, lowest, highest, q8s + f * n, e, r0, r1);
      for (int64_t j = c0; j < f; ++j) {
        const float vj = v[j * K + f];
        float* y = w + j * n;
        for (int64_t r = r0; r < r1; ++r) y[r] = y[r] + vj * e[r];
      }
    }
  });
}

// c [M, N] float32 += A B in bf16 operands summed in float32 (api.h's gemm_bf16: a int32 [M, K2], A's bf16 rows as
// pairs, each row's pairs contiguous; bp int32 [ceil(N / 32), K2, 32], B packed by src/quant/bf16gemm.py), rows split
// across ATen's threads by their work (upper: a row's columns shrink down the matrix, so the threads' row counts are
// uneven).
void gemm_bf16(at::Tensor& c, const at::Tensor& a, const at::Tensor& bp, bool upper) {
  TORCH_CHECK(k().gemm_bf16, "quantspec gemm_bf16: the ", k().name, " kernels have no bf16 dot product");
  TORCH_CHECK(c.dim() == 2 && c.scalar_type() == at::kFloat && c.stride(1) == 1 && a.dim() == 2 &&
                  a.scalar_type() == at::kInt && a.stride(1) == 1 && bp.dim() == 3 && bp.scalar_type() == at::kInt &&
                  bp.is_contiguous(),
              "quantspec gemm_bf16: float32 c and int32 a (rows contiguous), int32 bp contiguous");
  const int64_t M = c.size(0), N = c.size(1), K2 = a.size(1);
  TORCH_CHECK(a.size(0) == M && bp.size(0) == (N + 31) / 32 && bp.size(1) == K2 && bp.size(2) == 32,
              "quantspec gemm_bf16: shapes");
  const uint32_t *ap = reinterpret_cast<const uint32_t*>(a.data_ptr<int32_t>()),
                 *bpp = reinterpret_cast<const uint32_t*>(bp.data_ptr<int32_t>());
  float* cp = c.data_ptr<float>();
  const int64_t ldc = c.stride(0), parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), M / 8));
  auto edge = [&](int64_t i) -> int64_t {  // part i's first row, a multiple of 8: equal work (rows, or a triangle's)
    if (i >= parts) return M;
    const double share = double(i) / double(parts);
    return std::min(M, int64_t((upper ? 1.0 - std::sqrt(1.0 - share) : share) * double(M)) / 8 * 8);
  };
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t i = p0; i < p1; ++i) {
      const int64_t m0 = edge(i), m1 = edge(i + 1);
      if (m0 < m1) k().gemm_bf16(ap, a.stride(0), bpp, K2, N, m0, m1, upper, cp, ldc);
    }
  });
}

bool has_gemm_bf16() { return k().gemm_bf16 != nullptr; }

namespace {

// (qs::load reads a float32 or a bf16 element as float32: core/common.h, as the variants convert)
template <typename In>
void flipped_transpose_into(const In* src, int64_t R, int64_t C, float* out) {
  constexpr int64_t T = 64;  // a tile's rows and columns: its reads and writes stay in L1
  at::parallel_for(0, (C + T - 1) / T, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t c0 = t0 * T; c0 < std::min(C, t1 * T); c0 += T) {
      const int64_t c1 = std::min(C, c0 + T);
      for (int64_t r0 = 0; r0 < R; r0 += T) {
        const int64_t r1 = std::min(R, r0 + T);
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t sc = C - 1 - c;
          float* o = out + c * R;
          for (int64_t r = r0; r < r1; ++r) o[r] = qs::load(src, r * C + sc);
        }
      }
    }
  });
}

}  // namespace

// float32 [C, R] from src [R, C] (contiguous, bf16 or float32), its columns reversed: out[c][r] = src[r][C - 1 - c],
// torch's src.flip(1).T.float().contiguous() in one tiled pass, where torch's flip makes a copy and its transposing
// copy reads with a stride (an 11008 x 4096 bf16 weight: ~0.1 s against ~0.2). GPTQ holds a linear's weights so:
// transposed, in reverse feature order (src/quant/gptq.py).
at::Tensor flipped_transpose(const at::Tensor& src) {
  TORCH_CHECK(src.dim() == 2 && src.is_contiguous(), "quantspec flipped_transpose: a contiguous [R, C] tensor");
  const int64_t R = src.size(0), C = src.size(1);
  at::Tensor out = at::empty({C, R}, src.options().dtype(at::kFloat));
  if (src.scalar_type() == at::kBFloat16) {
    flipped_transpose_into(bits(src), R, C, out.data_ptr<float>());
  } else {
    TORCH_CHECK(src.scalar_type() == at::kFloat, "quantspec flipped_transpose: bf16 or float32");
    flipped_transpose_into(src.data_ptr<float>(), R, C, out.data_ptr<float>());
  }
  return out;
}

// AWQ's clip trial (src/quant/awq.py's _clipped_change, the same float operations in the same order: the file builds
// with -ffp-contract=off): for groups wg [G, r, g] float32 clipped to [-clip, clip] (clip, low, high [G, r]: the
// trial clip and each group's own min and max), each weight's change Q(w) - w on the clipped group's grid of
// 2^bits levels, as bf16 [G, r, g] (core/common.h's rounding, torch's .to(torch.bfloat16)'s), ready for the
// trial's bmm; one pass where torch's ops make ~9.
at::Tensor clip_change(const at::Tensor& wg, const at::Tensor& clip, const at::Tensor& low, const at::Tensor& high,
                       int64_t bits_) {
  TORCH_CHECK(wg.dim() == 3 && wg.scalar_type() == at::kFloat && wg.is_contiguous() &&
                  clip.scalar_type() == at::kFloat && clip.is_contiguous() && low.scalar_type() == at::kFloat &&
                  low.is_contiguous() && high.scalar_type() == at::kFloat && high.is_contiguous(),
              "quantspec clip_change: contiguous float32 tensors");
  const int64_t rows = wg.size(0) * wg.size(1), g = wg.size(2);
  TORCH_CHECK(clip.numel() == rows && low.numel() == rows && high.numel() == rows, "quantspec clip_change: shapes");
  TORCH_CHECK(1 <= bits_ && bits_ <= 8, "quantspec clip_change: 1 to 8 bits");
  at::Tensor out = at::empty(wg.sizes(), wg.options().dtype(at::kBFloat16));
  const float *w = wg.data_ptr<float>(), *cp = clip.data_ptr<float>(), *lp = low.data_ptr<float>(),
              *hp = high.data_ptr<float>();
  uint16_t* o = bits_out(out);
  const float top = float((1 << bits_) - 1);
  at::parallel_for(0, rows, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float c = cp[i], lo = std::max(lp[i], -c), hi = std::min(hp[i], c);
      const float s = std::max((hi - lo) / top, 1e-6f);
      const float* x = w + i * g;
      uint16_t* d = o + i * g;
      // SIMD lanes of the baseline ISA, the operations and their order unchanged (-O2's cost model had left the
      // loop scalar; std::min and std::max, returning references, had kept it from being vectorized at all)
#pragma omp simd
      for (int64_t j = 0; j < g; ++j) {
        const float u = clamp_to(round_even((clamp_to(x[j], -c, c) - lo) / s), 0.0f, top);
        d[j] = qs::f32_to_bf16((u * s + lo) - x[j]);
      }
    }
  });
  return out;
}

// sum_k y[i, k] * d[i, k] in float32 over bf16 rows y, d [.., g] (each product exact in float32): AWQ's clip trial's
// error d^T G d per (group, row), y = d G. Summed in 8 running sums (k mod 8) then those in order: torch sums in its
// own order, so the last bits may differ from (y.float() * d.float()).sum(-1).
at::Tensor row_dots_bf16(const at::Tensor& y, const at::Tensor& d) {
  TORCH_CHECK(y.scalar_type() == at::kBFloat16 && d.scalar_type() == at::kBFloat16 && y.is_contiguous() &&
                  d.is_contiguous() && y.sizes() == d.sizes() && y.dim() >= 1 && y.size(-1) % 8 == 0,
              "quantspec row_dots_bf16: contiguous bf16 tensors of one shape, rows a multiple of 8 long");
  const int64_t g = y.size(-1), rows = y.numel() / g;
  std::vector<int64_t> shape(y.sizes().begin(), y.sizes().end() - 1);
  at::Tensor out = at::empty(shape, y.options().dtype(at::kFloat));
  const uint16_t *yp = bits(y), *dp = bits(d);
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t k = 0; k < g; k += 8) {
        for (int j = 0; j < 8; ++j) {
          acc[j] += qs::bf16_to_f32(yp[i * g + k + j]) * qs::bf16_to_f32(dp[i * g + k + j]);
        }
      }
      op[i] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  });
  return out;
}

}  // namespace qs_ops

using namespace qs_ops;

TORCH_LIBRARY(quantspec, m) {
  m.def("use_variant(str path, str[] fallbacks) -> str");
  m.def("formats() -> str[]");
  m.def("variant() -> str");
  m.def("use_amx(str path, int feature) -> str");
  m.def("amx() -> bool");
  m.def("int8_gemm_amx(Tensor x, Tensor w, Tensor w_scale) -> Tensor");
  m.def("quantize_x8_bf16(Tensor x) -> (Tensor, Tensor)");
  m.def("scale_rows_bf16(Tensor(a!) y, Tensor x_scale) -> Tensor(a!)");
  m.def("dequant_grouped(Tensor packed, Tensor scale, Tensor offset, int group, int format) -> Tensor");
  m.def("gemv_float(Tensor x, Tensor w) -> Tensor");
  m.def("gemv_w8a8(Tensor x, Tensor w, Tensor w_scale, Tensor w_sum) -> Tensor");
  m.def("gemv_w8a16(Tensor x, Tensor w, Tensor w_scale) -> Tensor");
  m.def("gemv_grouped(Tensor x, Tensor packed, Tensor scale, Tensor offset, int group, int format) -> Tensor");
  m.def("gemv_w4a8(Tensor x, Tensor packed, Tensor scale, Tensor offset, int group) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps, bool gemma) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
  m.def("gptq_features(Tensor(a!) wt, Tensor w0t, Tensor factor, Tensor(b!) qt, Tensor(c!) err, Tensor lo, "
        "Tensor scale, int c0, int c1, int b0, int top, bool grouped) -> ()");
  m.def("gemm_bf16(Tensor(a!) c, Tensor a, Tensor bp, bool upper) -> ()");
  m.def("has_gemm_bf16() -> bool");
  m.def("flipped_transpose(Tensor src) -> Tensor");
  m.def("clip_change(Tensor wg, Tensor clip, Tensor low, Tensor high, int bits) -> Tensor");
  m.def("row_dots_bf16(Tensor y, Tensor d) -> Tensor");
  m.def("quantize_x8_blocks(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("gemm_grouped_x8(Tensor x, Tensor packed, Tensor scale, Tensor offset, int group, int format) -> Tensor");
  m.def("has_gemm_grouped_x8(int format) -> bool");
}

TORCH_LIBRARY_IMPL(quantspec, CPU, m) {
  m.impl("gemv_float", gemv_float);
  m.impl("gemv_w8a8", gemv_w8a8);
  m.impl("gemv_w8a16", gemv_w8a16);
  m.impl("gemv_grouped", gemv_grouped);
  m.impl("gemv_w4a8", gemv_w4a8);
  m.impl("dequant_grouped", dequant_grouped);
  m.impl("rms_norm", rms_norm);
  m.impl("decode_attention", decode_attention);
  m.impl("gptq_features", gptq_features);
  m.impl("gemm_bf16", gemm_bf16);
  m.impl("int8_gemm_amx", int8_gemm_amx);
  m.impl("quantize_x8_bf16", quantize_x8_bf16);
  m.impl("scale_rows_bf16", scale_rows_bf16);
  m.impl("flipped_transpose", flipped_transpose);
  m.impl("clip_change", clip_change);
  m.impl("row_dots_bf16", row_dots_bf16);
  m.impl("quantize_x8_blocks", quantize_x8_blocks);
  m.impl("gemm_grouped_x8", gemm_grouped_x8);
}

TORCH_LIBRARY_IMPL(quantspec, CatchAll, m) {
  m.impl("use_variant", use_variant);
  m.impl("variant", variant);
  m.impl("formats", formats);
  m.impl("use_amx", use_amx);
  m.impl("amx", amx);
  m.impl("has_gemm_bf16", has_gemm_bf16);
  m.impl("has_gemm_grouped_x8", has_gemm_grouped_x8);
}
