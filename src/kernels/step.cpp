// The decode step as one C++ call (engine.step_path=quantspec where src.engine.cstep covers the model):
// the layer loop of src.engine.fastpath with the Python, the dispatcher and ~1000 operator calls a step
// taken out. The kernels are the same (the variant's gemv, RMSNorm and attention, through ops.h); the glue
// between them (copies, residual adds, rotary positions) is plain loops over the activations' own type,
// each operation rounded as ATen rounds it (c10::BFloat16's arithmetic rounds every product and sum to
// bf16, as ATen's bf16 kernels do), and the activation function is ATen's own. So the logits are those of
// the Python step path, bit for bit: tests/test_cstep.py checks it for every family and precision.
//
// Two classes: Stepper holds a model's weights (built once per model by src.engine.cstep) and StepCache
// one sequence's keys and values ([KV heads, capacity, head dim] per layer, growing by a quarter).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/api.h"
#include "ops.h"

namespace {

using BF = c10::BFloat16;
using qs_ops::k;

enum Kind : int64_t { FLOAT = 0, W8A8 = 1, W8A16 = 2, W4A16 = 3 };
enum Slot : int64_t { QKV = 0, O = 1, GATE_UP = 2, DOWN = 3 };
enum Norm : int64_t { ATTN_IN = 0, ATTN_OUT = 1, MLP_IN = 2, MLP_OUT = 3, Q_NORM = 4, K_NORM = 5 };

// One kernel call of a projection: a GemvLinear or a quantized *Gemv module, or several of them fused
// (src.engine.fused), as its Python forward makes it: x cast to the kernel's input type, the kernel, the
// bias added, the result cast to the activations' type.
struct Call {
  int64_t kind;
  std::vector<at::Tensor> t;
  at::Tensor bias;  // undefined: none
  int64_t group;
  at::ScalarType in;

  at::Tensor run(const at::Tensor& x, at::ScalarType act) const {
    // named as the Python path's operators, so scripts/bench_step.py files them alike (free unless profiled)
    static const char* names[] = {"quantspec::gemv_float", "quantspec::gemv_w8a8", "quantspec::gemv_w8a16",
                                  "quantspec::gemv_w4a16"};
    RECORD_FUNCTION(names[kind], std::vector<c10::IValue>());
    const at::Tensor xi = x.scalar_type() == in ? x : x.to(in);
    at::Tensor y;
    switch (kind) {
      case FLOAT: y = qs_ops::gemv_float(xi, t[0]); break;
      case W8A8: y = qs_ops::gemv_w8a8(xi, t[0], t[1], t[2]); break;
      case W8A16: y = qs_ops::gemv_w8a16(xi, t[0], t[1]); break;
      case W4A16: y = qs_ops::gemv_w4a16(xi, t[0], t[1], t[2], group); break;
      default: TORCH_CHECK(false, "quantspec Stepper: unknown kernel kind ", kind);
    }
    if (bias.defined()) y = y + bias;
    return y.scalar_type() == act ? y : y.to(act);
  }
};

struct Layer {
  std::vector<Call> calls[4];  // by Slot
  at::Tensor norms[6];         // by Norm; undefined: the family has none there
  int64_t rope = 0;            // which rotary table
  int64_t window = 0;          // a sliding window (query p sees keys p - window < j <= p); 0: none
};

at::Tensor project(const std::vector<Call>& calls, const at::Tensor& x, at::ScalarType act) {
  if (calls.size() == 1) return calls[0].run(x, act);
  std::vector<at::Tensor> ys;
  for (const Call& c : calls) ys.push_back(c.run(x, act));
  return at::cat(ys, 1);
}

uint16_t* u16(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<BF>()); }
const uint16_t* u16(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<BF>()); }

struct StepCache : torch::CustomClassHolder {
  std::vector<at::Tensor> keys, values;  // per layer [KV heads, capacity, head dim]
  int64_t length = 0;

  int64_t size() const { return length; }
  void crop(int64_t n) {
    TORCH_CHECK(n >= 0 && n <= length, "quantspec StepCache: cannot drop ", n, " of ", length, " positions");
    length -= n;
  }
  int64_t capacity() const { return keys.empty() ? 0 : keys[0].size(1); }

  // Room for `needed` positions in every layer; a new buffer is a quarter (at least 256) larger, the
  // cached positions copied over.
  void reserve(int64_t layers, int64_t kv_heads, int64_t dim, at::ScalarType dtype, int64_t needed) {
    if (!keys.empty() && needed <= capacity()) return;
    const int64_t cap = needed + std::max<int64_t>(256, needed / 4);
    for (int64_t l = 0; l < layers; ++l) {
      at::Tensor nk = at::empty({kv_heads, cap, dim}, at::TensorOptions().dtype(dtype));
      at::Tensor nv = at::empty_like(nk);
      if (!keys.empty() && length) {
        nk.narrow(1, 0, length).copy_(keys[l].narrow(1, 0, length));
        nv.narrow(1, 0, length).copy_(values[l].narrow(1, 0, length));
      }
      if (static_cast<int64_t>(keys.size()) <= l) {
        keys.push_back(nk);
        values.push_back(nv);
      } else {
        keys[l] = nk;
        values[l] = nv;
      }
    }
  }
};

struct Stepper : torch::CustomClassHolder {
  int64_t heads, kv_heads, dim;
  double scaling, eps;
  bool gemma;       // RMSNorm's convention: y = x r (1 + w) (Gemma) or w * round(x r)
  std::string act;  // gelu_tanh or silu
  std::vector<Layer> layers;
  std::vector<at::Tensor> cos, sin;  // rotary tables [positions, dim], sin's first half negated
  at::Tensor final_norm;

  Stepper(int64_t heads, int64_t kv_heads, int64_t dim, double scaling, double eps, bool gemma, std::string act)
      : heads(heads), kv_heads(kv_heads), dim(dim), scaling(scaling), eps(eps), gemma(gemma), act(std::move(act)) {
    TORCH_CHECK(this->act == "gelu_tanh" || this->act == "silu", "quantspec Stepper: activation ", this->act);
  }

  void add_layer(std::vector<at::Tensor> norms, int64_t rope, int64_t window) {
    TORCH_CHECK(norms.size() == 6, "quantspec Stepper: six norm slots");
    Layer layer;
    for (int i = 0; i < 6; ++i)
      if (norms[i].numel()) layer.norms[i] = norms[i].contiguous();
    layer.rope = rope;
    layer.window = window;
    layers.push_back(std::move(layer));
  }

  void add_call(int64_t layer, int64_t slot, int64_t kind, std::vector<at::Tensor> tensors,
                std::vector<at::Tensor> bias, int64_t group, bool bf16_in) {
    TORCH_CHECK(layer < static_cast<int64_t>(layers.size()) && slot >= 0 && slot < 4, "quantspec Stepper: slot");
    Call call{kind, std::move(tensors), bias.empty() ? at::Tensor() : bias[0], group,
              bf16_in ? at::kBFloat16 : at::kFloat};
    layers[layer].calls[slot].push_back(std::move(call));
  }

  void set_rope(int64_t index, at::Tensor c, at::Tensor s) {
    if (static_cast<int64_t>(cos.size()) <= index) {
      cos.resize(index + 1);
      sin.resize(index + 1);
    }
    cos[index] = c.contiguous();
    sin[index] = s.contiguous();
  }

  void set_final_norm(at::Tensor w) { final_norm = w.contiguous(); }

  // Keys and values that transformers' cache holds for a layer ([KV heads, n, dim], the last n of
  // `length` positions: a sliding layer keeps only its window), after a prefill through its forward.
  void load(const c10::intrusive_ptr<StepCache>& cache, int64_t layer, at::Tensor key, at::Tensor value,
            int64_t length) {
    cache->reserve(layers.size(), kv_heads, dim, key.scalar_type(), length);
    const int64_t n = key.size(1);
    cache->keys[layer].narrow(1, length - n, n).copy_(key);
    cache->values[layer].narrow(1, length - n, n).copy_(value);
    cache->length = length;
  }

  // h [k, hidden], the new tokens' embeddings -> the final norm of the last `keep` rows [keep, hidden];
  // the k positions join the cache.
  at::Tensor forward(at::Tensor h, const c10::intrusive_ptr<StepCache>& cache, int64_t keep) {
    RECORD_FUNCTION("quantspec::step", std::vector<c10::IValue>());  // its self time: the loops' glue
    TORCH_CHECK(h.dim() == 2 && keep >= 1 && keep <= h.size(0), "quantspec Stepper: h [k, hidden], 1 <= keep <= k");
    const int64_t past = cache->length, n = h.size(0);
    for (const at::Tensor& table : cos)
      TORCH_CHECK(table.size(0) >= past + n, "quantspec Stepper: rotary table shorter than ", past + n);
    cache->reserve(layers.size(), kv_heads, dim, h.scalar_type(), past + n);
    h = h.contiguous().clone();  // the residual stream, updated in place
    if (h.scalar_type() == at::kBFloat16) return run<BF>(h, *cache, keep);
    TORCH_CHECK(h.scalar_type() == at::kFloat, "quantspec Stepper: float32 or bfloat16 activations");
    return run<float>(h, *cache, keep);
  }

 private:
  template <typename T>
  at::Tensor norm(const at::Tensor& x, const at::Tensor& w, int64_t d) const {
    RECORD_FUNCTION("quantspec::rms_norm", std::vector<c10::IValue>());
    at::Tensor y = at::empty_like(x);
    const int64_t rows = x.numel() / d;
    if constexpr (std::is_same_v<T, float>)
      k().rms_norm_f32(x.data_ptr<float>(), w.data_ptr<float>(), d, float(eps), gemma, 0, rows, y.data_ptr<float>());
    else
      k().rms_norm_bf16(u16(x), u16(w), d, float(eps), gemma, 0, rows, u16(y));
    return y;
  }

  // x [n, heads * dim] in place: x * cos + roll(x, dim / 2) * sin' (the Python path's three rounded ops).
  template <typename T>
  void rotate(at::Tensor& x, int64_t nheads, const at::Tensor& c, const at::Tensor& s, int64_t past) const {
    T* p = x.data_ptr<T>();
    const T* cp = c.data_ptr<T>();
    const T* sp = s.data_ptr<T>();
    const int64_t half = dim / 2, n = x.size(0);
    std::vector<T> row(dim);
    for (int64_t i = 0; i < n; ++i) {
      const T* ci = cp + (past + i) * dim;
      const T* si = sp + (past + i) * dim;
      for (int64_t h = 0; h < nheads; ++h) {
        T* r = p + (i * nheads + h) * dim;
        std::copy(r, r + dim, row.begin());
        for (int64_t j = 0; j < dim; ++j) {
          const T a = row[j] * ci[j];
          const T b = row[(j + half) % dim] * si[j];
          r[j] = a + b;
        }
      }
    }
  }

  template <typename T>
  static void add_into(at::Tensor& h, const at::Tensor& x) {
    T* hp = h.data_ptr<T>();
    const T* xp = x.data_ptr<T>();
    for (int64_t i = 0, e = h.numel(); i < e; ++i) hp[i] = hp[i] + xp[i];
  }

  template <typename T>
  at::Tensor run(at::Tensor& h, StepCache& cache, int64_t keep) {
    const at::ScalarType act_type = h.scalar_type();
    const int64_t n = h.size(0), past = cache.length, cap = cache.capacity();
    const int64_t qw = heads * dim, kw = kv_heads * dim;
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      const at::Tensor x = norm<T>(h, L.norms[ATTN_IN], h.size(1));
      const at::Tensor qkv = project(L.calls[QKV], x, act_type);
      at::Tensor q = qkv.narrow(1, 0, qw).contiguous(), key = qkv.narrow(1, qw, kw).contiguous();
      const at::Tensor value = qkv.narrow(1, qw + kw, kw);
      if (L.norms[Q_NORM].defined()) q = norm<T>(q, L.norms[Q_NORM], dim);
      if (L.norms[K_NORM].defined()) key = norm<T>(key, L.norms[K_NORM], dim);
      rotate<T>(q, heads, cos[L.rope], sin[L.rope], past);
      rotate<T>(key, kv_heads, cos[L.rope], sin[L.rope], past);
      at::Tensor out = at::empty({n, qw}, h.options());
      {  // the cache's update and attention, one profiler record (scripts/bench_step.py)
        RECORD_FUNCTION("quantspec::decode_attention", std::vector<c10::IValue>());
        // the new keys and values into the cache: [n, KV heads, dim] -> [KV heads, past + i, dim]
        at::Tensor& K = cache.keys[l];
        at::Tensor& V = cache.values[l];
        K.narrow(1, past, n).copy_(key.view({n, kv_heads, dim}).transpose(0, 1));
        V.narrow(1, past, n).copy_(value.reshape({n, kv_heads, dim}).transpose(0, 1));
        // each (query, head) on its own, query i at position past + i seeing its window's keys
        const T *qp = q.data_ptr<T>(), *kp = K.data_ptr<T>(), *vp = V.data_ptr<T>();
        T* op = out.data_ptr<T>();
        const int64_t window = L.window;
        const float scale = float(scaling);
        at::parallel_for(0, n * heads, 1, [&](int64_t i0, int64_t i1) {
          for (int64_t item = i0; item < i1;) {
            const int64_t i = item / heads, h0 = item % heads, h1 = std::min(heads, h0 + (i1 - item));
            const int64_t pos = past + i, start = window ? std::max<int64_t>(0, pos - window + 1) : 0;
            const int64_t len = pos - start + 1;
            const T* qi = qp + i * qw;
            T* oi = op + i * qw;
            if constexpr (std::is_same_v<T, float>)
              k().attention_f32(qi, kp + start * dim, vp + start * dim, cap * dim, heads, kv_heads, 1, len, dim, scale,
                                h0, h1, oi);
            else
              k().attention_bf16(reinterpret_cast<const uint16_t*>(qi), reinterpret_cast<const uint16_t*>(kp + start * dim),
                                 reinterpret_cast<const uint16_t*>(vp + start * dim), cap * dim, heads, kv_heads, 1, len,
                                 dim, scale, h0, h1, reinterpret_cast<uint16_t*>(oi));
            item += h1 - h0;
          }
        });
      }
      at::Tensor o = project(L.calls[O], out, act_type);
      if (L.norms[ATTN_OUT].defined()) o = norm<T>(o, L.norms[ATTN_OUT], o.size(1));
      add_into<T>(h, o);
      const at::Tensor gu = project(L.calls[GATE_UP], norm<T>(h, L.norms[MLP_IN], h.size(1)), act_type);
      const int64_t inter = gu.size(1) / 2;
      const at::Tensor gate = gu.narrow(1, 0, inter), up = gu.narrow(1, inter, inter);
      const at::Tensor a = (act == "silu" ? at::silu(gate) : at::gelu(gate, "tanh")) * up;
      at::Tensor d = project(L.calls[DOWN], a, act_type);
      if (L.norms[MLP_OUT].defined()) d = norm<T>(d, L.norms[MLP_OUT], d.size(1));
      add_into<T>(h, d);
    }
    cache.length = past + n;
    return norm<T>(h.narrow(0, n - keep, keep).contiguous(), final_norm, h.size(1));
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(quantspec, m) {
  m.class_<StepCache>("StepCache")
      .def(torch::init<>())
      .def("size", &StepCache::size)
      .def("crop", &StepCache::crop);
  m.class_<Stepper>("Stepper")
      .def(torch::init<int64_t, int64_t, int64_t, double, double, bool, std::string>())
      .def("add_layer", &Stepper::add_layer)
      .def("add_call", &Stepper::add_call)
      .def("set_rope", &Stepper::set_rope)
      .def("set_final_norm", &Stepper::set_final_norm)
      .def("load", &Stepper::load)
      .def("forward", &Stepper::forward);
}
