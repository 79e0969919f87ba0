// The decode step as one C++ call (engine.step_path=cpp where src.engine.cpp_step covers the model):
// the layer loop of src.engine.python_step with the Python, the dispatcher and ~1000 operator calls a step
// taken out. The kernels are the same (the variant's gemv, RMSNorm and attention, through ops.h); the glue
// between them (copies, residual adds, rotary positions) is plain loops over the activations' own type,
// each operation rounded as ATen rounds it (c10::BFloat16's arithmetic rounds every product and sum to
// bf16, as ATen's bf16 kernels do), and the activation function is ATen's own. So the logits are those of
// the Python step path, bit for bit: tests/engine/test_cpp_step.py checks it for every family and precision.
//
// Two classes: Stepper holds a model's weights (built once per model by src.engine.cpp_step) and StepCache
// one sequence's keys and values ([KV heads, capacity, head dim] per layer, growing by a quarter).
// The ATen headers of what this file uses, not ATen/ATen.h (why: binding.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/silu.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <omp.h>

#include "core/api.h"
#include "core/common.h"
#include "ops.h"

namespace {

using BF = c10::BFloat16;
using qs_ops::k;

// The weight formats a call runs: api.h's formats. These four have kernels of their own shape; every other is a grouped
// weight-only format (api.h's gemv_grouped), run by one path whatever its bits.
constexpr int64_t FLOAT = QS_FLOAT, W8A8 = QS_W8A8, W8A16 = QS_W8A16, W4A8 = QS_W4A8;
enum Slot : int64_t { QKV = 0, O = 1, GATE_UP = 2, DOWN = 3 };
enum Norm : int64_t { ATTN_IN = 0, ATTN_OUT = 1, MLP_IN = 2, MLP_OUT = 3, Q_NORM = 4, K_NORM = 5 };
enum Mode { HIDDEN, LOGITS, GREEDY };  // what a call returns: the final norm's rows, the head's, its argmax

// The greedy choice over the columns of the head a thread computes, in whatever order it computes them
// (the logits are never stored): the first NaN, else the first index of the largest value, as
// torch.argmax picks; banned ids left out, as eos_ban's -inf does. The threads' choices are merged by the
// same rule.
struct Pick {
  const char* banned;
  float top = -std::numeric_limits<float>::infinity();
  int64_t where = -1;
  inline __attribute__((always_inline)) void see(int64_t j, float v) {
    if (banned[j]) return;
    if (std::isnan(v) || std::isnan(top)) {  // a NaN beats any number; of two NaNs the first
      if (std::isnan(v) && (!std::isnan(top) || j < where)) top = v, where = j;
      return;
    }
    if (where < 0 || v > top || (v == top && j < where)) top = v, where = j;
  }
  // Whether any of a piece's values can be chosen, from its largest (`largest` rounded to the activations'
  // type, as see() is shown them: rounding never reverses an order) and whether it has a NaN: most of the
  // head's pieces cannot once a good token has been seen, and are not looked at one by one.
  bool may_take(float largest, bool nan) const {
    if (where >= 0 && std::isnan(top)) return nan;
    return where < 0 || nan || largest >= top;
  }
};

// The step's barrier: spin a little, then yield the core. OpenMP's own barrier spins for ~300k rounds
// before it sleeps; with a neighbour on the host two of the step's threads can share one core, and then a
// thread spinning at a barrier burns the very time slice its partner needs to arrive (Gemma 3 270M's w4a16
// step went from 11 to 28-55 ms beside one spinning process, ~90 barriers a step). Spinning first keeps a
// quiet host's barrier as quick as before: there the threads arrive within microseconds of each other.
struct alignas(64) Barrier {
  std::atomic<int> waiting{0};
  alignas(64) std::atomic<int> phase{0};
  std::atomic<int> n{1};
  static constexpr int SPINS = 4096;  // ~10-40 us of pause before yielding: a quiet step's waits are shorter

  // `waited`: the calling thread's seconds spent here, added to (Threads reads their sum).
  void wait(double& waited) {
    const int count = n.load(std::memory_order_relaxed);
    if (count == 1) return;
    const int ph = phase.load(std::memory_order_relaxed);
    if (waiting.fetch_add(1, std::memory_order_acq_rel) == count - 1) {  // the last to arrive lets the rest go
      waiting.store(0, std::memory_order_relaxed);
      phase.store(ph + 1, std::memory_order_release);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    struct Timed {
      double& waited;
      std::chrono::steady_clock::time_point start;
      ~Timed() { waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
    } timed{waited, start};
    for (int spins = 0; phase.load(std::memory_order_acquire) == ph; ++spins) {
      if (spins < SPINS) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
      } else {
        sched_yield();
      }
    }
  }
};

// How many threads a step runs on. The step's threads meet at ~90 barriers a step, so when the host gives
// one of them less than a core (a neighbour's process, a laptop's other work) every barrier waits for it.
// The results do not depend on the count (each column and attention item is computed alike by whichever
// thread takes it), so the count is chosen by measurement: each shape of call (rows, head or not) keeps a
// running time per candidate count (all, all but one, half, one) and runs on the fastest. On all threads it
// watches the share of the step its threads spent waiting at barriers (under 1% on a quiet host): when that
// passes 8%, or a step is much slower than usual, it tries another count for one step (such tries, while
// they lose, ever more rarely: 8 steps apart doubling to 256). So a quiet host pays for one try in 1024
// steps. On fewer threads it tries all threads every 8 steps doubling to 32, so that a neighbour's leaving
// is noticed within ~32 steps.
class Threads : public torch::CustomClassHolder {
 public:
  static constexpr int64_t FIRST_TRY = 8;     // on fewer threads: the first try of another count this soon
  static constexpr int64_t MAX_GAP_FEW = 32;  // ... doubling to this
  static constexpr int64_t MAX_GAP_ALL = 256; // on all threads, triggered tries that lose: gaps doubling to this
  static constexpr int64_t GAP_ALL = 1024;    // on all threads, untriggered tries this far apart (~0.1% of a
                                              // quiet run on two cores, where one thread is 2.2x slower)
  static constexpr double BETTER = 0.9;       // a try wins when it took < 0.9 of the current count's time
  static constexpr double SLOWER = 1.5;       // the current count this much slower than usual: try at once
  static constexpr double WAITING = 0.08;     // ... or its threads waiting this share of the step (measured
                                              // 0.007 quiet, 0.09-0.28 beside a busy core: Gemma 3 w4a16)

  bool adaptive = true;

  // The count for the next call of this shape; `want` is the caller's (torch's thread count).
  int choose(int64_t key, int want) {
    Shape& k = shapes[key];
    if (k.want != want) k = Shape(want);
    if (!adaptive || k.options.size() == 1) return k.trying = -1, want;
    k.trying = -1;
    if (k.step >= k.next_try) {
      k.turn = (k.turn + 1) % static_cast<int>(k.options.size());
      if (k.turn == k.current) k.turn = (k.turn + 1) % static_cast<int>(k.options.size());
      k.trying = k.turn;
    }
    return k.options[k.trying >= 0 ? k.trying : k.current].threads;
  }

  // The call's wall time in seconds on the count choose() gave, and the share of it its threads waited at
  // barriers (their waits summed over threads x wall time).
  void took(int64_t key, double seconds, double waiting) {
    Shape& k = shapes[key];
    ++k.step;
    if (!adaptive || k.options.size() == 1) return;
    Option& cur = k.options[k.current];
    if (k.trying < 0) {
      cur.time = cur.seen ? 0.8 * cur.time + 0.2 * seconds : seconds;
      k.waiting = cur.seen ? 0.8 * k.waiting + 0.2 * waiting : waiting;
      ++cur.seen;
      if (cur.usual == 0 || cur.time < cur.usual) cur.usual = cur.time;
      else cur.usual = 0.99 * cur.usual + 0.01 * cur.time;  // drifts up slowly as the context grows
      const bool slower = cur.time > SLOWER * cur.usual, stalled = k.current == 0 && k.waiting > WAITING;
      // the host changed: try now, unless such tries have kept losing (then ever more rarely, as on fewer)
      if (cur.seen > 4 && (slower || stalled) && k.step >= k.allowed && k.next_try > k.step) {
        k.next_try = k.step;
        cur.time = cur.usual = std::max(cur.time, seconds);  // the try is held against now, not the average
        k.waiting = 0;
      }
      return;
    }
    Option& tried = k.options[k.trying];
    tried.time = seconds;
    tried.seen = 1;
    if (seconds < BETTER * cur.time) {  // the other count is faster now: it becomes the current one
      tried.usual = seconds;
      k.current = k.trying;
      k.gap = FIRST_TRY;
    } else {
      k.gap = std::min(2 * k.gap, k.current == 0 ? MAX_GAP_ALL : MAX_GAP_FEW);
    }
    k.allowed = k.step + k.gap;
    k.next_try = k.step + (k.current == 0 ? GAP_ALL : k.gap);
  }

  void count(int threads) { ++runs[threads]; }

  // choose() and took() as one call, for tests and scripts that drive the choice with times of their own.
  int64_t next(int64_t key, int64_t want) { return choose(key, static_cast<int>(want)); }
  void record(int64_t key, int64_t threads, double seconds, double waiting) {
    took(key, seconds, waiting);
    count(static_cast<int>(threads));
  }
  // [count, calls, count, calls, ...]: the calls run so far on each thread count, over every shape of call
  // (what a job records).
  std::vector<int64_t> counts() const {
    std::vector<int64_t> out;
    for (const auto& [count, calls] : runs) out.insert(out.end(), {count, calls});
    return out;
  }

 private:
  struct Option {
    int threads;
    double time = 0, usual = 0;  // running time per call; its usual (lowest, slowly drifting) level
    int64_t seen = 0;
  };
  struct Shape {
    int want = 0;
    std::vector<Option> options;  // all threads first
    int current = 0, trying = -1, turn = 0;
    int64_t step = 0, next_try = GAP_ALL, gap = FIRST_TRY, allowed = 0;  // allowed: a triggered try's earliest
    double waiting = 0;  // running share of the step spent at barriers, on all threads
    Shape() = default;
    explicit Shape(int want) : want(want) {
      for (int t : {want, want - 1, want / 2, 1})
        if (t >= 1 && (options.empty() || options.back().threads > t)) options.push_back(Option{t});
    }
  };
  std::map<int64_t, Shape> shapes;
  std::map<int64_t, int64_t> runs;  // calls by thread count, whatever their shape
};

// A counter of the chunks of one thread's columns handed out, alone on its cache line; it starts at 1, the
// first chunk being its owner's without asking (project()).
struct alignas(64) Ticket {
  std::atomic<int64_t> n{1};
};

// The largest of v[0..count) and whether any is NaN (then the largest means nothing), vectorised: the
// head's pieces pass here (std::max's form, a reference and a branch, left the loop scalar, ~1% of a step).
inline float largest_of(const float* v, int64_t count, bool* nan) {
  float m = -std::numeric_limits<float>::infinity();
  int any = 0;
#pragma omp simd reduction(max : m) reduction(| : any)
  for (int64_t i = 0; i < count; ++i) {
    const float x = v[i];
    m = m > x ? m : x;
    any |= x != x;
  }
  *nan = any != 0;
  return m;
}

// y's values rounded to bf16 as c10::BFloat16 rounds them (qs::f32_to_bf16, branch-free), vectorised:
// every layer projection's output passes here.
inline void round_into(const float* y, int64_t count, BF* out) {
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) o[j] = qs::f32_to_bf16(y[j]);
}

// One kernel call of a projection: a GemvLinear or a quantized *Gemv module, or several of them fused
// (src.engine.fused), computed as its Python forward computes it: x cast to the kernel's input type, the
// kernel (a bf16 input gets bf16 output, as binding.cpp's columns() rounds it), the bias added in the type
// ATen promotes the two to, the result cast to the activations' type.
struct Call {
  int64_t format;
  std::vector<at::Tensor> t;
  at::Tensor bias;  // undefined: none
  int64_t group;
  at::ScalarType in;
  int64_t K = 0, N = 0;
  int64_t offset = 0;  // its first column in the projection's output (calls of one projection side by side)
  int64_t bits = 0;    // its weights' bits (api.h), and whether it is a grouped weight-only format
  bool grouped = false;
  // The tensors' addresses, read once: a step's stream of weights evicts everything between two calls, and
  // a tensor's data_ptr() is a chain of dependent loads (each then a miss to memory).
  const void *w = nullptr, *w2 = nullptr, *bias_p = nullptr;
  const float* w1 = nullptr;
};

struct Layer {
  std::vector<Call> calls[4];  // by Slot
  at::Tensor norms[6];         // by Norm; undefined: the family has none there
  const void* norm_p[6] = {};  // their addresses (Call's why); null: none
  int64_t rope = 0;            // which rotary table
  int64_t window = 0;          // a sliding window (query p sees keys p - window < j <= p); 0: none
  int64_t width[4] = {0, 0, 0, 0};  // each projection's output columns
};

template <typename T>
float to_f(T v) { return static_cast<float>(v); }
inline float round_bf16(float v) { return qs::bf16_to_f32(qs::f32_to_bf16(v)); }

// as the Python path's operators are named, so that scripts/bench_step.py files them alike
const std::vector<std::string> NAMES = [] {
  std::vector<std::string> names;
#define QS_FORMAT_NAME(id, name, bits) names.push_back(std::string("quantspec::gemv_") + name);
  QS_FORMATS(QS_FORMAT_NAME)
#undef QS_FORMAT_NAME
  return names;
}();

struct StepCache : torch::CustomClassHolder {
  std::vector<at::Tensor> keys, values;  // per layer [KV heads, capacity, head dim]
  int64_t length = 0;

  int64_t size() const { return length; }
  void crop(int64_t n) {
    TORCH_CHECK(n >= 0 && n <= length, "quantspec StepCache: cannot drop ", n, " of ", length, " positions");
    length -= n;
  }
  int64_t capacity() const { return keys.empty() ? 0 : keys[0].size(1); }
  // Bytes its buffers hold (every layer's keys and values, at their capacity): what a prefix cache counts.
  int64_t nbytes() const {
    int64_t total = 0;
    for (size_t l = 0; l < keys.size(); ++l) total += keys[l].nbytes() + values[l].nbytes();
    return total;
  }
  // A new cache holding this one's first n positions (copied: the two then grow apart), with the room a step
  // would reserve past them, so the next step does not copy them again.
  c10::intrusive_ptr<StepCache> prefix(int64_t n) const {
    TORCH_CHECK(n >= 0 && n <= length, "quantspec StepCache: no prefix of ", n, " in ", length, " positions");
    auto out = c10::make_intrusive<StepCache>();
    if (keys.empty()) return out;
    out->reserve(keys.size(), keys[0].size(0), keys[0].size(2), keys[0].scalar_type(), n);
    for (size_t l = 0; l < keys.size(); ++l) {
      out->keys[l].narrow(1, 0, n).copy_(keys[l].narrow(1, 0, n));
      out->values[l].narrow(1, 0, n).copy_(values[l].narrow(1, 0, n));
    }
    out->length = n;
    return out;
  }

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

// Each thread's own buffers: the residual stream and what feeds a kernel are computed by every thread
// alike (a few thousand values), so that only a kernel's output, split by columns, is shared and waits
// at a barrier.
struct Private {
  at::Tensor h, x, act_out;  // activations' type: the residual stream [n, hidden], a kernel's input
  at::Tensor kept;           // the rows returned, gathered [rows, hidden]
  at::Tensor xin;            // a kernel's input in its own type, where that differs from the activations'
  at::Tensor xf;             // float32 copy for the quantizers
  at::Tensor xq, xs, sums;   // quantized rows, their scales, grouped formats' group sums
  at::Tensor xsb;            // int8 blocks' scales (quantize_x8_blocks; its xo go to sums)
  void* xin_p;               // their addresses (Call's why)
  float *xf_p, *xs_p, *sums_p, *xsb_p;
  uint8_t* xq_p;
};

// One sequence's share of a call: its cache, and its rows (first .. first + rows) among the call's, at
// positions past .. past + rows. A single sequence's call has one; a batched call (batch_*) one per sequence,
// each row computed exactly as it would be alone (the kernels' rows are independent, attention is per row).
struct Seq {
  StepCache* cache;
  int64_t first, rows, past;
};

struct Stepper : torch::CustomClassHolder {
  int64_t heads, kv_heads, dim;
  double scaling, eps;
  bool gemma;       // RMSNorm's convention: y = x r (1 + w) (Gemma) or w * round(x r)
  std::string act;  // gelu_tanh or silu
  std::vector<Layer> layers;
  std::vector<at::Tensor> cos, sin;  // rotary tables [positions, dim], sin's first half negated
  std::vector<const void*> cos_p, sin_p;  // their addresses (Call's why)
  at::Tensor final_norm;
  at::Tensor embedding, embed_scale;  // [vocabulary, hidden]; Gemma's scale (0-dim), undefined for none
  std::vector<Call> head;  // the output projection, where it runs here (set_head)
  int64_t max_k = 0, max_n = 0;  // the widest kernel input; the widest layer projection (not the head)
  // A batched call's projections of at least this many rows take int8 activations at the grouped linears
  // (api.h's gemm_grouped_x8, where the variant has one: precision.batch_activations=int8); 0: never. Only
  // batch_* calls: a single sequence's steps and a draft's verification keep the 16-bit kernels, row for row.
  int64_t x8_rows = 0;
  std::vector<char> banned_mask;  // a greedy step's banned ids, by id (all 0 outside a call)
  std::vector<char> no_ban;       // all 0: the mask of a batched greedy row that bans nothing
  Threads threads;                 // how many threads each call runs on
  std::vector<double> waits;       // seconds each thread of the last call waited at barriers
  double last_waiting = 0;         // their sum over threads x the call's wall time

  // The share of the last call its threads spent waiting at barriers (scripts/bench_contention.py says it).
  double waiting_share() const { return last_waiting; }

  // Whether the thread count adapts to the host (Threads); off, every call runs on torch's thread count.
  void adapt_threads(bool on) { threads.adaptive = on; }
  // [count, calls, count, calls, ...]: the calls run so far on each thread count.
  std::vector<int64_t> thread_counts() const { return threads.counts(); }

  Stepper(int64_t heads, int64_t kv_heads, int64_t dim, double scaling, double eps, bool gemma, std::string act)
      : heads(heads), kv_heads(kv_heads), dim(dim), scaling(scaling), eps(eps), gemma(gemma), act(std::move(act)) {
    TORCH_CHECK(this->act == "gelu_tanh" || this->act == "silu", "quantspec Stepper: activation ", this->act);
  }

  void add_layer(std::vector<at::Tensor> norms, int64_t rope, int64_t window) {
    TORCH_CHECK(norms.size() == 6, "quantspec Stepper: six norm slots");
    Layer layer;
    for (int i = 0; i < 6; ++i)
      if (norms[i].numel()) {
        layer.norms[i] = norms[i].contiguous();
        layer.norm_p[i] = layer.norms[i].data_ptr();
      }
    layer.rope = rope;
    layer.window = window;
    layers.push_back(std::move(layer));
  }

  void add_call(int64_t layer, int64_t slot, int64_t format, std::vector<at::Tensor> tensors,
                std::vector<at::Tensor> bias, int64_t group, bool bf16_in) {
    TORCH_CHECK(layer < static_cast<int64_t>(layers.size()) && slot >= 0 && slot < 4, "quantspec Stepper: slot");
    Call call = make_call(format, std::move(tensors), std::move(bias), group, bf16_in);
    Layer& L = layers[layer];
    call.offset = L.width[slot];
    L.width[slot] += call.N;
    max_n = std::max(max_n, L.width[slot]);
    L.calls[slot].push_back(std::move(call));
  }

  // The output projection over the whole vocabulary, so that a step's logits (or its greedy token) come
  // from the same call; none: forward() returns the final norm's rows and the caller applies its head.
  void set_head(int64_t format, std::vector<at::Tensor> tensors, std::vector<at::Tensor> bias, int64_t group,
                bool bf16_in) {
    head.clear();
    head.push_back(make_call(format, std::move(tensors), std::move(bias), group, bf16_in));
  }

  void clear_head() { head.clear(); }

  void set_x8_rows(int64_t rows) {
    TORCH_CHECK(rows >= 0, "quantspec Stepper: x8 rows >= 0");
    x8_rows = rows;
  }

  Call make_call(int64_t format, std::vector<at::Tensor> tensors, std::vector<at::Tensor> bias, int64_t group,
                 bool bf16_in) {
    const bool grouped = format > W8A16 && format < QS_FORMAT_COUNT && format != W4A8 && k().gemv_grouped[format];
    TORCH_CHECK((format >= FLOAT && format <= W8A16) || format == W4A8 || grouped, "quantspec Stepper: unknown weight format ",
                format);
    TORCH_CHECK(!tensors.empty(), "quantspec Stepper: a call without weights");
    for (const at::Tensor& t : tensors) TORCH_CHECK(t.is_contiguous(), "quantspec Stepper: contiguous weights");
    const at::Tensor& w = tensors[0];
    const bool packed = grouped || format == W4A8;  // K values in K * bits / 8 bytes a row, in groups
    const int64_t step = packed ? 128 : format == W8A8 ? 64 : format == W8A16 ? 32 : w.scalar_type() == at::kFloat ? 16 : 32;
    Call call{format, std::move(tensors), bias.empty() ? at::Tensor() : bias[0].contiguous(), group,
              bf16_in ? at::kBFloat16 : at::kFloat};
    call.w = call.t[0].data_ptr();
    call.w1 = call.t.size() > 1 ? static_cast<const float*>(call.t[1].data_ptr()) : nullptr;
    call.w2 = call.t.size() > 2 ? call.t[2].data_ptr() : nullptr;
    call.bias_p = call.bias.defined() ? call.bias.data_ptr() : nullptr;
    call.N = w.size(0);
    call.bits = qs_format_bits(int(format));
    call.grouped = grouped;
    call.K = packed ? w.size(1) * 8 / call.bits : w.size(1);
    TORCH_CHECK(call.K % step == 0 && (!packed || (group % 128 == 0 && call.K % group == 0)),
                "quantspec Stepper: K = ", call.K, " does not fit the kernel");
    TORCH_CHECK(format != FLOAT || w.scalar_type() == call.in, "quantspec Stepper: a float weight takes its own type");
    max_k = std::max(max_k, call.K);
    return call;
  }

  void set_rope(int64_t index, at::Tensor c, at::Tensor s) {
    if (static_cast<int64_t>(cos.size()) <= index) {
      cos.resize(index + 1);
      sin.resize(index + 1);
      cos_p.resize(index + 1);
      sin_p.resize(index + 1);
    }
    cos[index] = c.contiguous();
    sin[index] = s.contiguous();
    cos_p[index] = cos[index].data_ptr();
    sin_p[index] = sin[index].data_ptr();
  }

  void set_final_norm(at::Tensor w) { final_norm = w.contiguous(); }

  // The token embedding, times `scale` where the model scales it (Gemma: sqrt(hidden) in the weight's type).
  void set_embedding(at::Tensor weight, std::vector<at::Tensor> scale) {
    embedding = weight.contiguous();
    embed_scale = scale.empty() ? at::Tensor() : scale[0].to(weight.scalar_type());
  }

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

  // ids [k], the new tokens -> the final norm of the last `keep` rows [keep, hidden]; the k positions
  // join the cache.
  at::Tensor forward(at::Tensor ids, const c10::intrusive_ptr<StepCache>& cache, int64_t keep) {
    return one(ids, *cache, keep, HIDDEN, at::Tensor());
  }

  // The head's logits for the last `keep` rows [keep, vocabulary] (set_head first).
  at::Tensor logits(at::Tensor ids, const c10::intrusive_ptr<StepCache>& cache, int64_t keep) {
    TORCH_CHECK(!head.empty(), "quantspec Stepper: no head set");
    return one(ids, *cache, keep, LOGITS, at::Tensor());
  }

  // The last row's greedy token: the first index of the largest logit (torch.argmax's choice, a NaN
  // counting as the largest), `banned` ids left out (as eos_ban's -inf does), without the logits ever
  // leaving the threads that computed them.
  int64_t greedy(at::Tensor ids, const c10::intrusive_ptr<StepCache>& cache, at::Tensor banned) {
    TORCH_CHECK(!head.empty(), "quantspec Stepper: no head set");
    TORCH_CHECK(banned.scalar_type() == at::kLong && banned.dim() == 1, "quantspec Stepper: banned ids int64 [b]");
    return one(ids, *cache, 1, GREEDY, banned.contiguous()).item<int64_t>();
  }

  // Several sequences at once (continuous batching, src.engine.batching): ids [n] holds each sequence's new
  // tokens in turn, counts[s] of them for caches[s] (a decode step's one, or a chunk of a prompt); one call
  // through each projection for all n rows, attention per row over its own sequence's cache. What comes back
  // is for the last row of each sequence s with emit[s] (a prompt's chunk before its last emits nothing):
  // batch_hidden its final norm [e, hidden], batch_logits its logits [e, vocabulary], batch_greedy its greedy
  // token [e] (`banned` ids left out of the sequences with ban[s]); e may be 0 (prompt chunks only). Each row's values are those of the same
  // sequence run alone, bit for bit (tests/engine/test_batching.py).
  at::Tensor batch_hidden(at::Tensor ids, std::vector<c10::intrusive_ptr<StepCache>> caches, std::vector<int64_t> counts,
                          std::vector<int64_t> emit) {
    return many(ids, caches, counts, emit, {}, HIDDEN, at::Tensor());
  }
  at::Tensor batch_logits(at::Tensor ids, std::vector<c10::intrusive_ptr<StepCache>> caches, std::vector<int64_t> counts,
                          std::vector<int64_t> emit) {
    TORCH_CHECK(!head.empty(), "quantspec Stepper: no head set");
    return many(ids, caches, counts, emit, {}, LOGITS, at::Tensor());
  }
  at::Tensor batch_greedy(at::Tensor ids, std::vector<c10::intrusive_ptr<StepCache>> caches, std::vector<int64_t> counts,
                          std::vector<int64_t> emit, at::Tensor banned, std::vector<int64_t> ban) {
    TORCH_CHECK(!head.empty(), "quantspec Stepper: no head set");
    TORCH_CHECK(banned.scalar_type() == at::kLong && banned.dim() == 1, "quantspec Stepper: banned ids int64 [b]");
    return many(ids, caches, counts, emit, ban, GREEDY, banned.contiguous());
  }

 private:
  // One sequence's call: its last `keep` rows returned (a greedy call's last row).
  at::Tensor one(const at::Tensor& ids, StepCache& cache, int64_t keep, Mode mode, const at::Tensor& banned) {
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong && keep >= 1 && keep <= ids.size(0),
                "quantspec Stepper: ids int64 [k], 1 <= keep <= k");
    const int64_t n = ids.size(0), rows = mode == GREEDY ? 1 : keep;
    std::vector<int64_t> kept;
    for (int64_t i = n - rows; i < n; ++i) kept.push_back(i);
    return enter(ids, {Seq{&cache, 0, n, cache.length}}, kept, {1}, mode, banned);
  }

  at::Tensor many(const at::Tensor& ids, const std::vector<c10::intrusive_ptr<StepCache>>& caches,
                  const std::vector<int64_t>& counts, const std::vector<int64_t>& emit, const std::vector<int64_t>& ban,
                  Mode mode, const at::Tensor& banned) {
    const size_t S = caches.size();
    TORCH_CHECK(S >= 1 && counts.size() == S && emit.size() == S && (mode != GREEDY || ban.size() == S),
                "quantspec Stepper: one count and one emit flag (and for greedy, one ban flag) per sequence");
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "quantspec Stepper: ids int64 [n]");
    std::vector<Seq> seqs;
    std::vector<int64_t> kept;
    std::vector<char> bans;
    int64_t first = 0;
    for (size_t s = 0; s < S; ++s) {
      TORCH_CHECK(counts[s] >= 1, "quantspec Stepper: a sequence without new tokens");
      for (size_t r = 0; r < s; ++r)
        TORCH_CHECK(caches[r].get() != caches[s].get(), "quantspec Stepper: one sequence twice in a batch");
      seqs.push_back(Seq{caches[s].get(), first, counts[s], caches[s]->length});
      first += counts[s];
      if (emit[s]) {
        kept.push_back(first - 1);
        bans.push_back(mode == GREEDY && ban[s] ? 1 : 0);
      }
    }
    TORCH_CHECK(first == ids.size(0), "quantspec Stepper: counts add up to ", first, ", not the ", ids.size(0), " ids");
    return enter(ids, seqs, kept, bans, mode, banned, x8_rows);
  }

  // x8_from: projections of at least this many rows on int8 activations (x8_rows; 0: none).
  at::Tensor enter(const at::Tensor& ids, const std::vector<Seq>& seqs, const std::vector<int64_t>& kept,
                   const std::vector<char>& bans, Mode mode, const at::Tensor& banned, int64_t x8_from = 0) {
    RECORD_FUNCTION("quantspec::step", std::vector<c10::IValue>());  // its self time: the glue and the waits
    TORCH_CHECK(!layers.empty() && final_norm.defined() && embedding.defined(), "quantspec Stepper: not set up");
    const int64_t n = ids.size(0), vocab = embedding.size(0);
    TORCH_CHECK(embedding.scalar_type() == at::kFloat || embedding.scalar_type() == at::kBFloat16,
                "quantspec Stepper: float32 or bfloat16 activations");
    TORCH_CHECK(!cos.empty(), "quantspec Stepper: no rotary tables set");
    for (const Seq& s : seqs)
      for (const at::Tensor& table : cos)
        TORCH_CHECK(table.size(0) >= s.past + s.rows && table.scalar_type() == embedding.scalar_type(),
                    "quantspec Stepper: rotary table shorter than ", s.past + s.rows, " or of another type");
    const at::Tensor tokens = ids.contiguous();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = tokens.data_ptr<int64_t>()[i];
      TORCH_CHECK(t >= 0 && t < vocab, "quantspec Stepper: token ", t, " outside the vocabulary of ", vocab);
    }
    for (const Seq& s : seqs) s.cache->reserve(layers.size(), kv_heads, dim, embedding.scalar_type(), s.past + s.rows);
    const int64_t shape = 2 * n + (mode != HIDDEN);  // calls alike in cost share their thread counts' times
    const int nt = threads.choose(shape, std::max(1, at::get_num_threads()));
    const auto start = std::chrono::steady_clock::now();
    at::Tensor out = embedding.scalar_type() == at::kBFloat16
                         ? run<BF>(embed<BF>(tokens), seqs, kept, bans, mode, banned, nt, x8_from)
                         : run<float>(embed<float>(tokens), seqs, kept, bans, mode, banned, nt, x8_from);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double waited = 0;
    for (double w : waits) waited += w;
    last_waiting = seconds > 0 ? waited / (nt * seconds) : 0;
    threads.took(shape, seconds, last_waiting);
    threads.count(nt);
    return out;
  }

  // The tokens' rows of the embedding [n, hidden], times its scale as the model's module multiplies them.
  template <typename T>
  at::Tensor embed(const at::Tensor& tokens) const {
    const int64_t n = tokens.size(0), hidden = embedding.size(1);
    at::Tensor h = at::empty({n, hidden}, embedding.options());
    const T* table = embedding.data_ptr<T>();
    T* out = h.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      const T* row = table + tokens.data_ptr<int64_t>()[i] * hidden;
      if (!embed_scale.defined()) {
        std::copy(row, row + hidden, out + i * hidden);
        continue;
      }
      const T scale = embed_scale.data_ptr<T>()[0];
      for (int64_t j = 0; j < hidden; ++j) out[i * hidden + j] = row[j] * scale;
    }
    return h;
  }
  template <typename T>
  void norm_rows(const T* x, const void* w, int64_t d, int64_t rows, T* y) const {
    if constexpr (std::is_same_v<T, float>)
      k().rms_norm_f32(x, static_cast<const float*>(w), d, float(eps), gemma, 0, rows, y);
    else
      k().rms_norm_bf16(reinterpret_cast<const uint16_t*>(x), static_cast<const uint16_t*>(w), d, float(eps), gemma,
                        0, rows, reinterpret_cast<uint16_t*>(y));
  }

  // One head's row r [dim] at position pos, in place: x * cos + roll(x, dim / 2) * sin' (the Python path's
  // three rounded ops); `row` is scratch of dim values.
  template <typename T>
  void rotate(T* r, int64_t pos, const void* c, const void* s, T* row) const {
    const T* ci = static_cast<const T*>(c) + pos * dim;
    const T* si = static_cast<const T*>(s) + pos * dim;
    const int64_t half = dim / 2;
    std::copy(r, r + dim, row);
    for (int64_t j = 0; j < half; ++j) r[j] = row[j] * ci[j] + row[j + half] * si[j];
    for (int64_t j = half; j < dim; ++j) r[j] = row[j] * ci[j] + row[j - half] * si[j];
  }

  // The cached keys and values a layer's attention will read (its window's, before this step's rows),
  // asked for before q, k and v stream in so that they arrive meanwhile: the step's stream of weights has
  // evicted them since the last step, and read cold they were ~15% of the attention's time (timed in
  // turns: ~20 us of ~130 a step on gemma3-270m). Into L2 (prefetcht2), as measured a little better than L1.
  template <typename T>
  void fetch_cache_rows(const StepCache& cache, size_t l, int64_t past, int64_t window) const {
    const int64_t start = window ? std::max<int64_t>(0, past - window + 1) : 0, row = dim * sizeof(T);
    const int64_t cap = cache.capacity();
    const char* kb = static_cast<const char*>(cache.keys[l].data_ptr());
    const char* vb = static_cast<const char*>(cache.values[l].data_ptr());
    for (int64_t g = 0; g < kv_heads; ++g)
      for (int64_t b = (g * cap + start) * row; b < (g * cap + past) * row; b += 64) {
        __builtin_prefetch(kb + b, 0, 1);
        __builtin_prefetch(vb + b, 0, 1);
      }
  }

  // h += norm(out) (Gemma's sandwich norms) or h += out, on this thread's copy of the residual stream.
  template <typename T>
  void add_residual(T* h, const T* out, const void* norm, int64_t hidden, int64_t n, T* scratch) const {
    if (norm != nullptr) {
      norm_rows<T>(out, norm, hidden, n, scratch);
      out = scratch;
    }
    for (int64_t i = 0; i < n * hidden; ++i) h[i] = h[i] + out[i];
  }

  // This thread's share of a projection: x [n, K] (activations' type, this thread's own copy) through each
  // call's kernel over the chunks of columns this thread takes (`tickets`: the call's, one per thread; moved
  // past them), finished into out [n, width] (shared), or with `pick` (the head of a greedy step: one Pick
  // per row) each finished value seen by its row's Pick instead of stored. x8: the grouped calls on int8
  // activations (x8_rows), where the variant has the kernel.
  template <typename T>
  void project(const std::vector<Call>& calls, int64_t width, const T* x, int64_t n, Private& p, float* y, T* out,
               int tid, int nt, Ticket*& tickets, Pick* pick = nullptr, bool x8 = false) const {
    const qs_kernels& kern = k();
    // What p's quantized x holds (calls after the first reuse it: q, k and v, or gate and up, meet the same x):
    // the quantizer (0 none, 8 w8a8's, 4 w4a8's, 16 the int16 one, 128 the int8 blocks'), x's type, and the group
    // its sums are for.
    int held_quantizer = 0, held_bf16 = -1;
    int64_t held_group = -1;
    for (const Call& c : calls) {
      const int64_t K = c.K, N = c.N, blocks = (N + 3) / 4;
      const bool bf16_in = c.in == at::kBFloat16;
      // the kernel's input: x in its own type, then (quantized formats) as float32 for the quantizers
      const void* xin = x;
      if (bf16_in != std::is_same_v<T, BF>) {
        if (bf16_in) {
          uint16_t* xb = static_cast<uint16_t*>(p.xin_p);
          for (int64_t i = 0; i < n * K; ++i) xb[i] = qs::f32_to_bf16(to_f(x[i]));
          xin = xb;
        } else {
          float* xf = static_cast<float*>(p.xin_p);
          for (int64_t i = 0; i < n * K; ++i) xf[i] = to_f(x[i]);
          xin = xf;
        }
      }
      const float* xs = p.xs_p;
      // int8 blocks take bf16 x (a grouped call's always is: GroupedGemv.step_call)
      const bool blocks8 = x8 && c.grouped && bf16_in && kern.gemm_grouped_x8[c.format] != nullptr;
      const int quantizer = blocks8 ? 128 : c.format == FLOAT ? 0 : c.format == W8A8 ? 8 : c.format == W4A8 ? 4 : 16;
      const int64_t group = c.grouped || c.format == W4A8 ? c.group : 0;
      // the int16 quantizer's values do not depend on the group: only its sums do (w8a16 reads none); the int8
      // blocks' are the same for every group
      const bool held = quantizer != 0 && quantizer == held_quantizer && int(bf16_in) == held_bf16 &&
                        (group == held_group || (quantizer == 16 && group == 0) || quantizer == 128);
      if (quantizer == 128 && !held) {
        held_quantizer = quantizer, held_bf16 = int(bf16_in), held_group = group;
        kern.quantize_x8_blocks(static_cast<const uint16_t*>(xin), K, 0, n, reinterpret_cast<int8_t*>(p.xq_p), p.xsb_p,
                                p.sums_p);
      } else if (quantizer != 0 && !held) {
        held_quantizer = quantizer, held_bf16 = int(bf16_in), held_group = group;
        float* xf = p.xf_p;
        if (bf16_in)
          for (int64_t i = 0; i < n * K; ++i) xf[i] = qs::bf16_to_f32(static_cast<const uint16_t*>(xin)[i]);
        else
          std::copy(static_cast<const float*>(xin), static_cast<const float*>(xin) + n * K, xf);
        if (c.format == W8A8)
          kern.quantize_x8(xf, n, K, p.xq_p, p.xs_p);
        else if (c.format == W4A8)
          kern.quantize_x8_w4(xf, n, K, c.group, reinterpret_cast<int8_t*>(p.xq_p), p.xs_p, p.sums_p);
        else
          kern.quantize_x16(xf, n, K, c.grouped ? c.group : 0, reinterpret_cast<int16_t*>(p.xq_p), p.xs_p,
                            c.grouped ? p.sums_p : nullptr);
      }
      float* yc = y + n * c.offset;  // each call's own [n, N] (the kernels' layout), side by side
      // In pieces of ~256 KB of weights, each finished while its outputs are in cache (as binding.cpp's
      // columns() does: one call over a whole slice of the head measured 13% slower in bf16).
      const int64_t row_bytes = c.grouped || c.format == W4A8 ? K * c.bits / 8 : c.format == FLOAT ? (bf16_in ? 2 : 4) * K : K;
      const int64_t piece = 4 * std::max<int64_t>(1, (256 << 10) / (4 * row_bytes));
      const void *w = c.w, *w2 = c.w2, *bias = c.bias_p;
      const float *w1 = c.w1, *sums = p.sums_p;
      const uint8_t* xq = p.xq_p;
      const int16_t* q16 = reinterpret_cast<const int16_t*>(xq);
      const bool has_bias = bias != nullptr;
      const bool bias_bf16 = has_bias && c.bias.scalar_type() == at::kBFloat16;
      auto finish = [&](int64_t a, int64_t b) {  // b - a <= piece
        switch (c.format) {
          case FLOAT:
            if (bf16_in)
              kern.gemv_bf16(static_cast<const uint16_t*>(xin), static_cast<const uint16_t*>(w), n, K, N, a, b, yc);
            else
              kern.gemv_f32(static_cast<const float*>(xin), static_cast<const float*>(w), n, K, N, a, b, yc);
            break;
          case W8A8:
            kern.gemv_w8a8(xq, xs, static_cast<const int8_t*>(w), w1, static_cast<const int32_t*>(w2), n, K, N, a, b,
                           yc);
            break;
          case W8A16:
            kern.gemv_w8a16(q16, xs, static_cast<const int8_t*>(w), w1, n, K, N, a, b, yc);
            break;
          case W4A8:
            kern.gemv_w4a8(reinterpret_cast<const int8_t*>(xq), xs, sums, static_cast<const uint8_t*>(w), w1,
                           static_cast<const float*>(w2), c.group, n, K, N, a, b, yc);
            break;
          default:  // a grouped format
            if (blocks8)
              kern.gemm_grouped_x8[c.format](reinterpret_cast<const int8_t*>(xq), p.xsb_p, sums,
                                             static_cast<const uint8_t*>(w), w1, static_cast<const float*>(w2), c.group,
                                             n, K, N, a, b, yc);
            else
              kern.gemv_grouped[c.format](q16, xs, sums, static_cast<const uint8_t*>(w), w1, static_cast<const float*>(w2),
                                          c.group, n, K, N, a, b, yc);
        }
        for (int64_t m = 0; m < n; ++m) {
          const float* ym = yc + m * N;
          if (!has_bias && bf16_in == std::is_same_v<T, BF>) {  // the common case: one rounding at most
            if (pick != nullptr) {
              bool nan;
              const float largest = largest_of(ym + a, b - a, &nan);
              if (pick[m].may_take(to_f(T(largest)), nan))
                for (int64_t j = a; j < b; ++j) pick[m].see(c.offset + j, to_f(T(ym[j])));
            } else {
              T* om = out + m * width + c.offset;
              if constexpr (std::is_same_v<T, BF>)
                round_into(ym + a, b - a, om + a);
              else
                std::copy(ym + a, ym + b, om + a);
            }
            continue;
          }
          auto finished = [&](int64_t j) -> T {  // the value the Python path's module returns
            float v = ym[j];
            if (bf16_in) v = round_bf16(v);
            if (has_bias) {
              v = v + (bias_bf16 ? to_f(static_cast<const BF*>(bias)[j]) : static_cast<const float*>(bias)[j]);
              if (bf16_in && bias_bf16) v = round_bf16(v);
            }
            return T(v);
          };
          if (pick != nullptr) {
            for (int64_t j = a; j < b; ++j) pick[m].see(c.offset + j, to_f(finished(j)));
            continue;
          }
          T* om = out + m * width + c.offset;
          for (int64_t j = a; j < b; ++j) om[j] = finished(j);
        }
      };
      auto work = [&](int64_t a, int64_t b, const Ticket* soon = nullptr, const Ticket* soon2 = nullptr) {
        for (; a < b; a += piece) {
          if (soon != nullptr && a + piece >= b) {
            __builtin_prefetch(soon, 1, 3);
            __builtin_prefetch(soon2, 1, 3);
          }
          finish(a, std::min(b, a + piece));
        }
      };
      // This thread's columns in chunks from the front, then, its own done, chunks from the back of the
      // previous thread's (each thread's range has one such helper; a counter per range hands out each
      // chunk once, its atomic add being the only cost): the threads reach the barrier together however the
      // host slows one of them. A range's first 3/4 are one chunk, its last quarter four or more chunks of
      // at least 16 KB and at most a piece: what is left to share is the end, and few atomics are paid.
      // Each column is computed alike whoever computes it.
      struct Chunks {
        int64_t r0, r1, first, size, count;
        int64_t begin(int64_t i) const { return i == 0 ? r0 : std::min(r1, first + (i - 1) * size); }
        int64_t end(int64_t i) const { return i == 0 ? first : std::min(r1, first + i * size); }
      };
      auto chunks = [&](int t) {
        Chunks ch;
        ch.r0 = 4 * (blocks * t / nt);
        ch.r1 = std::min(N, 4 * (blocks * (t + 1) / nt));
        ch.first = ch.r0 + 4 * ((ch.r1 - ch.r0) * 3 / 16);
        const int64_t tail = ch.r1 - ch.first;
        ch.size = std::min(piece, 4 * std::max<int64_t>(1, std::max<int64_t>(16 << 10, tail * row_bytes / 4) / (4 * row_bytes)));
        ch.count = 1 + (tail + ch.size - 1) / ch.size;
        return ch;
      };
      const Chunks own = chunks(tid);
      // The first chunk is always its owner's (tickets start at 1); the counters' lines, evicted by the
      // stream of weights, are fetched while its last piece is computed.
      work(own.begin(0), own.end(0), tickets + tid, nt > 1 ? tickets + (tid + nt - 1) % nt : tickets + tid);
      for (int64_t i = 1; tickets[tid].n.fetch_add(1, std::memory_order_relaxed) < own.count; ++i)
        work(own.begin(i), own.end(i));
      if (nt > 1) {
        const int victim = (tid + nt - 1) % nt;
        const Chunks theirs = chunks(victim);
        for (int64_t i = theirs.count - 1; tickets[victim].n.fetch_add(1, std::memory_order_relaxed) < theirs.count; --i)
          work(theirs.begin(i), theirs.end(i));
      }
      tickets += nt;
    }
  }

  template <typename T>
  at::Tensor run(const at::Tensor& input, const std::vector<Seq>& seqs, const std::vector<int64_t>& kept,
                 const std::vector<char>& bans, Mode mode, const at::Tensor& banned, int want, int64_t x8_from) {
    const at::ScalarType act_type = input.scalar_type();
    const int64_t n = input.size(0), hidden = input.size(1), rows = static_cast<int64_t>(kept.size());
    // each row's sequence and position
    std::vector<int64_t> seq_of(n), pos_of(n);
    for (size_t s = 0; s < seqs.size(); ++s)
      for (int64_t r = 0; r < seqs[s].rows; ++r) {
        seq_of[seqs[s].first + r] = static_cast<int64_t>(s);
        pos_of[seqs[s].first + r] = seqs[s].past + r;
      }
    const int64_t qw = heads * dim, kw = kv_heads * dim;
    const auto opt = input.options();
    const auto fopt = opt.dtype(at::kFloat);
    // shared: the kernels' float output, each projection's finished output, the attention's
    // two shared outputs, taken in turns (q/k/v and gate/up into one, o and down into the other), so that a
    // projection never overwrites what a thread may still be reading and needs no barrier before it
    // the head writes its own output and needs the float scratch vocabulary-wide only when it runs
    const int64_t widest = mode == HIDDEN || head.empty() ? max_n : std::max(max_n, head[0].N);
    at::Tensor y = at::empty({n, widest}, fopt), proj_a = at::empty({n, max_n}, opt);
    at::Tensor proj_b = at::empty({n, hidden}, opt), q = at::empty({n, qw}, opt);
    at::Tensor attn = at::empty({n, qw}, opt);
    std::vector<Private> priv(want);
    const int64_t x8 = std::max<int64_t>(k().x8_bytes, 2);
    for (Private& p : priv) {
      p.h = input.clone();
      p.x = at::empty({n, max_k}, opt);
      p.kept = at::empty({rows, hidden}, opt);
      p.xin = at::empty({n, max_k}, opt.dtype(act_type == at::kFloat ? at::kBFloat16 : at::kFloat));
      p.xf = at::empty({n, max_k}, fopt);
      p.xq = at::empty({n, max_k * x8}, opt.dtype(at::kByte));
      p.xs = at::empty({n}, fopt);
      p.sums = at::empty({n, max_k / 128 + 1}, fopt);
      p.xsb = at::empty({n, max_k / 128 + 1}, fopt);
      p.xin_p = p.xin.data_ptr();
      p.xf_p = p.xf.data_ptr<float>();
      p.xs_p = p.xs.data_ptr<float>();
      p.sums_p = p.sums.data_ptr<float>();
      p.xsb_p = p.xsb.data_ptr<float>();
      p.xq_p = p.xq.data_ptr<uint8_t>();
    }
    const float scale = float(scaling);
    T *pa = proj_a.data_ptr<T>(), *pb = proj_b.data_ptr<T>(), *qp = q.data_ptr<T>(), *ap = attn.data_ptr<T>();
    float* yp = y.data_ptr<float>();
    const int64_t vocab = head.empty() ? 0 : head[0].N;
    // a greedy step's logits are never stored (Pick)
    at::Tensor out = mode == HIDDEN ? at::empty({rows, hidden}, opt) : at::empty({rows, mode == GREEDY ? 0 : vocab}, opt);
    T* outp = out.data_ptr<T>();
    std::vector<float> best(want * rows, -std::numeric_limits<float>::infinity());  // [thread, row]
    std::vector<int64_t> best_at(want * rows, -1);
    size_t sites = head.size();  // the kernel calls of a step, each with a Ticket per thread (project())
    for (const Layer& L : layers)
      for (const auto& slot : L.calls) sites += slot.size();
    std::vector<Ticket> tickets(sites * want);  // each at 1: a range's first chunk is its owner's
    const int64_t* ban = mode == GREEDY ? banned.data_ptr<int64_t>() : nullptr;
    // the mask is kept all 0 between calls (rather than filled vocabulary-wide each token): set here, and
    // cleared when this call ends, however it ends
    auto mark = [&](char on) {
      for (int64_t i = 0; ban != nullptr && i < banned.numel(); ++i)
        if (ban[i] >= 0 && ban[i] < vocab) banned_mask[ban[i]] = on;
    };
    if (mode == GREEDY) banned_mask.resize(vocab, 0), no_ban.resize(vocab, 0);
    mark(1);
    struct Unmark {
      decltype(mark)& f;
      ~Unmark() { f(0); }
    } unmark{mark};
    Barrier bar;
    waits.assign(want, 0.0);
#pragma omp parallel num_threads(want)
    {
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
      bar.n.store(nt, std::memory_order_relaxed);  // every thread stores the same count before it first waits
      double& waited = waits[tid];
      Private& me = priv[tid];
      Ticket* next = tickets.data();  // the next call's tickets (every thread makes the same calls in turn)
      T* h = me.h.data_ptr<T>();
      T* x = me.x.data_ptr<T>();
      std::vector<T> row(dim);  // rotate()'s scratch
      std::vector<T*> kcs(seqs.size()), vcs(seqs.size());
      std::vector<int64_t> caps(seqs.size());
      const bool silu = act == "silu";
      int64_t act_width = -1;  // the width the activation's views below were made for
      at::Tensor gate, up;     // views of the gate/up projection's shared output
      // a projection into the shared output (pp), then a barrier: one profiler record on the calling
      // thread, its wait included
      auto projected = [&](const Layer& L, int slot, const T* in, T* out) {
        RECORD_FUNCTION(NAMES[L.calls[slot][0].format].c_str(), std::vector<c10::IValue>());
        project<T>(L.calls[slot], L.width[slot], in, n, me, yp, out, tid, nt, next, nullptr, x8_from > 0 && n >= x8_from);
        bar.wait(waited);
      };
      for (size_t l = 0; l < layers.size(); ++l) {
        const Layer& L = layers[l];
        // q, k, v
        norm_rows<T>(h, L.norm_p[ATTN_IN], hidden, n, x);
        for (const Seq& s : seqs) fetch_cache_rows<T>(*s.cache, l, s.past, L.window);
        projected(L, QKV, x, pa);
        // q/k norms, rotary positions and the cache's new rows: each thread readies the query heads it
        // attends (no other thread reads them), the first thread the keys, the last the values; attention
        {
          RECORD_FUNCTION("quantspec::decode_attention", std::vector<c10::IValue>());
          // each sequence's cache of this layer: its keys, values and capacity (positions per KV head)
          for (size_t s = 0; s < seqs.size(); ++s) {
            kcs[s] = seqs[s].cache->keys[l].template data_ptr<T>();
            vcs[s] = seqs[s].cache->values[l].template data_ptr<T>();
            caps[s] = seqs[s].cache->capacity();
          }
          const int64_t w = L.width[QKV], items = n * heads, i0 = items * tid / nt, i1 = items * (tid + 1) / nt;
          for (int64_t item = i0; item < i1; ++item) {
            const int64_t i = item / heads, hd = item % heads;
            T* qh = qp + i * qw + hd * dim;
            std::copy(pa + i * w + hd * dim, pa + i * w + (hd + 1) * dim, qh);
            if (L.norm_p[Q_NORM]) norm_rows<T>(qh, L.norm_p[Q_NORM], dim, 1, qh);
            rotate<T>(qh, pos_of[i], cos_p[L.rope], sin_p[L.rope], row.data());
          }
          if (tid == 0)
            for (int64_t i = 0; i < n; ++i)
              for (int64_t g = 0; g < kv_heads; ++g) {
                const int64_t s = seq_of[i];
                T* kh = kcs[s] + (g * caps[s] + pos_of[i]) * dim;
                std::copy(pa + i * w + qw + g * dim, pa + i * w + qw + (g + 1) * dim, kh);
                if (L.norm_p[K_NORM]) norm_rows<T>(kh, L.norm_p[K_NORM], dim, 1, kh);
                rotate<T>(kh, pos_of[i], cos_p[L.rope], sin_p[L.rope], row.data());
              }
          if (tid == nt - 1)
            for (int64_t i = 0; i < n; ++i)
              for (int64_t g = 0; g < kv_heads; ++g) {
                const int64_t s = seq_of[i];
                const T* v = pa + i * w + qw + kw + g * dim;
                std::copy(v, v + dim, vcs[s] + (g * caps[s] + pos_of[i]) * dim);
              }
          bar.wait(waited);
          // attention: each (query, head) alone, query i at position past + i seeing its window's keys
          {
            const int64_t items = n * heads, i0 = items * tid / nt, i1 = items * (tid + 1) / nt;
            for (int64_t item = i0; item < i1;) {
              const int64_t i = item / heads, h0 = item % heads, h1 = std::min(heads, h0 + (i1 - item));
              const int64_t pos = pos_of[i], start = L.window ? std::max<int64_t>(0, pos - L.window + 1) : 0;
              const int64_t len = pos - start + 1, s = seq_of[i], cap = caps[s];
              const T *kc = kcs[s], *vc = vcs[s];
              if constexpr (std::is_same_v<T, float>)
                k().attention_f32(qp + i * qw, kc + start * dim, vc + start * dim, cap * dim, heads, kv_heads, 1, len,
                                  dim, scale, h0, h1, ap + i * qw);
              else
                k().attention_bf16(reinterpret_cast<const uint16_t*>(qp + i * qw),
                                   reinterpret_cast<const uint16_t*>(kc + start * dim),
                                   reinterpret_cast<const uint16_t*>(vc + start * dim), cap * dim, heads, kv_heads, 1,
                                   len, dim, scale, h0, h1, reinterpret_cast<uint16_t*>(ap + i * qw));
              item += h1 - h0;
            }
          }
          bar.wait(waited);
        }
        // the output projection, its norm (Gemma) and the residual, each thread on its own copy
        projected(L, O, ap, pb);
        add_residual<T>(h, pb, L.norm_p[ATTN_OUT], hidden, n, x);
        norm_rows<T>(h, L.norm_p[MLP_IN], hidden, n, x);
        projected(L, GATE_UP, x, pa);
        // the activation is ATen's own (its vectorised tanh/exp), on the same [n, I] views as the Python path;
        // the views and the output made once a call, not once a layer (ATen's slicing and a fresh output per
        // layer were ~50 us of a ~5 ms step in the profile)
        const int64_t inter = L.width[GATE_UP] / 2;
        if (inter != act_width) {
          const at::Tensor both = at::from_blob(pa, {n, 2 * inter}, opt);
          gate = both.narrow(1, 0, inter);
          up = both.narrow(1, inter, inter);
          me.act_out = at::empty({n, inter}, opt);
          act_width = inter;
        }
        if (silu)
          at::silu_out(me.act_out, gate);
        else
          at::gelu_out(me.act_out, gate, "tanh");
        me.act_out.mul_(up);
        projected(L, DOWN, me.act_out.data_ptr<T>(), pb);
        add_residual<T>(h, pb, L.norm_p[MLP_OUT], hidden, n, x);
      }
      // the final norm of the rows kept (gathered: a batch's are one per sequence); then the head, split by
      // columns like any projection
      T* last = me.kept.data_ptr<T>();
      for (int64_t r = 0; r < rows; ++r) std::copy(h + kept[r] * hidden, h + (kept[r] + 1) * hidden, last + r * hidden);
      if (rows == 0) {
        // a batch of prompt chunks that emits nothing: no norm, no head
      } else if (mode == HIDDEN) {
        if (tid == 0) norm_rows<T>(last, final_norm.data_ptr(), hidden, rows, outp);
      } else {
        norm_rows<T>(last, final_norm.data_ptr(), hidden, rows, x);
        RECORD_FUNCTION(NAMES[head[0].format].c_str(), std::vector<c10::IValue>());
        if (mode == GREEDY) {  // this thread's columns, seen as they are computed, by each row's Pick
          std::vector<Pick> picks;
          for (int64_t r = 0; r < rows; ++r) picks.push_back(Pick{bans[r] ? banned_mask.data() : no_ban.data()});
          project<T>(head, vocab, x, rows, me, yp, outp, tid, nt, next, picks.data(), x8_from > 0 && rows >= x8_from);
          for (int64_t r = 0; r < rows; ++r) {
            best[tid * rows + r] = picks[r].top;
            best_at[tid * rows + r] = picks[r].where;
          }
        } else {
          project<T>(head, vocab, x, rows, me, yp, outp, tid, nt, next, nullptr, x8_from > 0 && rows >= x8_from);
        }
      }
    }
    for (const Seq& s : seqs) s.cache->length = s.past + s.rows;
    if (mode != GREEDY) return out;
    // each row's threads' choices, seen in their columns' order by the same rule as each thread's own
    at::Tensor chosen = at::empty({rows}, at::kLong);
    for (int64_t r = 0; r < rows; ++r) {
      Pick all{bans[r] ? banned_mask.data() : no_ban.data()};
      for (int t = 0; t < want; ++t)
        if (best_at[t * rows + r] >= 0) all.see(best_at[t * rows + r], best[t * rows + r]);
      chosen.data_ptr<int64_t>()[r] = all.where;
    }
    return chosen;
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(quantspec, m) {
  m.class_<Threads>("Threads")
      .def(torch::init<>())
      .def("next", &Threads::next)
      .def("record", &Threads::record)
      .def("counts", &Threads::counts);
  m.class_<StepCache>("StepCache")
      .def(torch::init<>())
      .def("size", &StepCache::size)
      .def("crop", &StepCache::crop)
      .def("nbytes", &StepCache::nbytes)
      .def("prefix", &StepCache::prefix);
  m.class_<Stepper>("Stepper")
      .def(torch::init<int64_t, int64_t, int64_t, double, double, bool, std::string>())
      .def("add_layer", &Stepper::add_layer)
      .def("add_call", &Stepper::add_call)
      .def("set_rope", &Stepper::set_rope)
      .def("set_final_norm", &Stepper::set_final_norm)
      .def("set_embedding", &Stepper::set_embedding)
      .def("set_head", &Stepper::set_head)
      .def("clear_head", &Stepper::clear_head)
      .def("set_x8_rows", &Stepper::set_x8_rows)
      .def("logits", &Stepper::logits)
      .def("greedy", &Stepper::greedy)
      .def("load", &Stepper::load)
      .def("adapt_threads", &Stepper::adapt_threads)
      .def("thread_counts", &Stepper::thread_counts)
      .def("waiting_share", &Stepper::waiting_share)
      .def("forward", &Stepper::forward)
      .def("batch_hidden", &Stepper::batch_hidden)
      .def("batch_logits", &Stepper::batch_logits)
      .def("batch_greedy", &Stepper::batch_greedy);
}
