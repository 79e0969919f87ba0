// A variant checked against the reference variant without torch, so that one built for another
// architecture can be checked under an emulator (qemu-aarch64 for the Arm builds):
//
//   selftest VARIANT.so REFERENCE.so
//
// For every op: the variant's result against the reference's within the bound each op's arithmetic
// allows (the integer formats' sums are exact, w8a8 and the int4 unpacking bit for bit), and row
// independence (each row computed among 16 equals that row alone, bit for bit). Prints one line per
// check and a closing "N passed, N failed"; exits 1 on any failure.
#include <dlfcn.h>
#include <stdio.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "api.h"
#include "common.h"

namespace {

int passed = 0, failed = 0;

void check(bool ok, const std::string& what, double err = 0) {
  printf("%s %s (max error %.3g)\n", ok ? "ok  " : "FAIL", what.c_str(), err);
  (ok ? passed : failed)++;
}

struct Rng {   // deterministic, the same on every host
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint32_t next() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return uint32_t(s >> 32); }
  float normal() { float a = 0; for (int i = 0; i < 4; ++i) a += (next() >> 8) * (1.f / 16777216.f); return (a - 2.f) * 1.7f; }
};

const qs_kernels* open_variant(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "cannot load %s: %s\n", path, dlerror()); return nullptr; }
  auto get = reinterpret_cast<const qs_kernels* (*)()>(dlsym(h, "qs_kernels_get"));
  const qs_kernels* t = get ? get() : nullptr;
  if (!t || t->abi != QS_ABI) { fprintf(stderr, "%s: no kernel table of ABI %d\n", path, QS_ABI); return nullptr; }
  return t;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double top = 0, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    top = std::max(top, std::fabs(double(b[i])));
    err = std::max(err, std::fabs(double(a[i]) - double(b[i])));
  }
  return top > 0 ? err / top : err;
}

constexpr int64_t M = 16, K = 1024, N = 45, G = 128;   // N: blocks of 4 and a tail

struct Inputs {
  std::vector<float> x, wf, ws, scale, offset;
  std::vector<uint16_t> xb, wb;
  std::vector<int8_t> w8;
  std::vector<int32_t> wsum;
  std::vector<uint8_t> w4;  // N * K bytes: enough for any grouped format's packed weight (at most 8 bits)
  Inputs() {
    Rng r;
    for (int64_t i = 0; i < M * K; ++i) x.push_back(r.normal() * std::pow(10.f, float(i % K) / K * 2 - 1));
    for (int64_t i = 0; i < N * K; ++i) wf.push_back(r.normal());
    for (float v : x) xb.push_back(qs::f32_to_bf16(v));
    for (float v : wf) wb.push_back(qs::f32_to_bf16(v));
    for (int64_t n = 0; n < N; ++n) {
      int32_t s = 0;
      for (int64_t k = 0; k < K; ++k) { w8.push_back(int8_t(int(r.next() % 255) - 127)); s += w8.back(); }
      wsum.push_back(s);
      ws.push_back(0.01f + (r.next() % 1000) * 1e-5f);
    }
    for (int64_t i = 0; i < N * K; ++i) w4.push_back(uint8_t(r.next()));
    for (int64_t i = 0; i < N * K / G; ++i) { scale.push_back(0.02f + (r.next() % 100) * 1e-4f); offset.push_back(-8 * scale.back() + r.normal() * 1e-3f); }
  }
};

// A grouped format's number by its name (api.h's QS_FORMATS), or -1.
int grouped_format(const std::string& format) {
  int f = 0;
#define QS_FORMAT_FIND(k, name, bits) if (format == name) return f; ++f;
  QS_FORMATS(QS_FORMAT_FIND)
#undef QS_FORMAT_FIND
  return -1;
}

// y [m, N] from one variant for the first m rows of x.
std::vector<float> gemv(const qs_kernels* t, const Inputs& in, const std::string& format, int64_t m, int64_t row0 = 0) {
  std::vector<float> y(m * N);
  const float* x = in.x.data() + row0 * K;
  if (format == "f32") t->gemv_f32(x, in.wf.data(), m, K, N, 0, N, y.data());
  if (format == "bf16") t->gemv_bf16(in.xb.data() + row0 * K, in.wb.data(), m, K, N, 0, N, y.data());
  if (format == "w8a8") {
    std::vector<uint8_t> q(m * K * t->x8_bytes);
    std::vector<float> xs(m);
    t->quantize_x8(x, m, K, q.data(), xs.data());
    t->gemv_w8a8(q.data(), xs.data(), in.w8.data(), in.ws.data(), in.wsum.data(), m, K, N, 0, N, y.data());
  }
  const int f = format == "w4a8" ? -1 : grouped_format(format);
  const bool grouped = f > QS_W8A16;
  if (format == "w8a16" || grouped) {
    std::vector<int16_t> q(m * K);
    std::vector<float> xs(m), sums(m * K / G);
    t->quantize_x16(x, m, K, grouped ? G : 0, q.data(), xs.data(), grouped ? sums.data() : nullptr);
    if (grouped) t->gemv_grouped[f](q.data(), xs.data(), sums.data(), in.w4.data(), in.scale.data(), in.offset.data(), G, m, K, N, 0, N, y.data());
    else t->gemv_w8a16(q.data(), xs.data(), in.w8.data(), in.ws.data(), m, K, N, 0, N, y.data());
  }
  if (format == "w4a8") {
    std::vector<int8_t> q(m * K);
    std::vector<float> xs(m), sums(m * K / G);
    t->quantize_x8_w4(x, m, K, G, q.data(), xs.data(), sums.data());
    t->gemv_w4a8(q.data(), xs.data(), sums.data(), in.w4.data(), in.scale.data(), in.offset.data(), G, m, K, N, 0, N, y.data());
  }
  return y;
}

template <typename T>
std::vector<float> attention(const qs_kernels* t, const std::vector<T>& q, const std::vector<T>& k, int64_t Q, int64_t D,
                             int64_t L) {
  const int64_t H = 4, KVH = 2;
  std::vector<T> out(H * Q * D);
  if constexpr (sizeof(T) == 4) t->attention_f32(q.data(), k.data(), k.data() + KVH * L * D, L * D, H, KVH, Q, L, D, 0.125f, 0, H * Q, out.data());
  else t->attention_bf16(q.data(), k.data(), k.data() + KVH * L * D, L * D, H, KVH, Q, L, D, 0.125f, 0, H * Q, out.data());
  std::vector<float> f;
  for (T v : out) f.push_back(qs::load(&v, 0));
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: selftest VARIANT.so REFERENCE.so\n"); return 2; }
  const qs_kernels* v = open_variant(argv[1]);
  const qs_kernels* ref = open_variant(argv[2]);
  if (!v || !ref) return 2;
  printf("variant %s against %s\n", v->name, ref->name);
  const Inputs in;
  // every grouped format the variant has a kernel of its own for (the others run the reference's: api.h)
  std::vector<std::string> kinds = {"f32", "bf16", "w8a8", "w8a16", "w4a8"};
  int f = 0;
#define QS_FORMAT_GROUPED(k, name, bits) if (v->gemv_grouped[f]) kinds.push_back(name); ++f;
  QS_FORMATS(QS_FORMAT_GROUPED)
#undef QS_FORMAT_GROUPED
  for (const std::string& k : kinds) {
    const std::vector<float> all = gemv(v, in, k, M), expect = gemv(ref, in, k, M);
    const double err = rel_err(all, expect);
    check(k == "w8a8" ? err == 0 : err < 1e-6, k + " against the reference", err);
    bool alone = true;
    for (int64_t m = 0; m < M; ++m) {
      const std::vector<float> one = gemv(v, in, k, 1, m);
      alone = alone && memcmp(one.data(), all.data() + m * N, N * sizeof(float)) == 0;
    }
    check(alone, k + ": each of 16 rows equals that row alone");
  }
  {  // the int16 quantizer (w8a16 and the grouped formats' x), bit for bit, on rows that test its edges: a NaN
     // (skipped by max|x|), an infinity, all zeros, values below the floor's scale; with group sums and without
    for (int64_t k : {K, int64_t(640), int64_t(96)}) {  // the step's K: a multiple of 32 (w8a16), of 128 (grouped)
      const int64_t rows = 6, group = k % G == 0 ? G : 0;
      std::vector<float> x(in.x.begin(), in.x.begin() + rows * k);
      x[1 * k + 5] = x[1 * k + k - 1] = NAN;  // the last: where a NaN-propagating max would keep it
      x[2 * k + 3] = INFINITY;
      for (int64_t i = 0; i < k; ++i) x[3 * k + i] = 0.f;
      for (int64_t i = 0; i < k; ++i) x[4 * k + i] *= 1e-33f;
      std::vector<int16_t> qv(rows * k), qr(rows * k);
      std::vector<float> sv(rows), sr(rows), gv(rows * k / G + 1), gr(rows * k / G + 1);
      v->quantize_x16(x.data(), rows, k, group, qv.data(), sv.data(), group ? gv.data() : nullptr);
      ref->quantize_x16(x.data(), rows, k, group, qr.data(), sr.data(), group ? gr.data() : nullptr);
      bool same = qv == qr && gv == gr && std::memcmp(sv.data(), sr.data(), rows * sizeof(float)) == 0;
      check(same, "int16 quantizer, K=" + std::to_string(k) + (group ? ", group sums" : "") + ", bit for bit");
    }
  }
  {  // w4a8's prefill quantizer and rescale, bit for bit
    std::vector<uint16_t> qv(M * K), qr(M * K), yv(in.xb.begin(), in.xb.begin() + M * N), yr = yv;
    std::vector<float> sv(M), sr(M);
    v->quantize_x8_bf16(in.xb.data(), K, 0, M, qv.data(), sv.data());
    ref->quantize_x8_bf16(in.xb.data(), K, 0, M, qr.data(), sr.data());
    v->scale_rows_bf16(yv.data(), N, sr.data(), 0, M);
    ref->scale_rows_bf16(yr.data(), N, sr.data(), 0, M);
    check(qv == qr && sv == sr && yv == yr, "w4a8's prefill quantizer and rescale, bit for bit");
  }
  {  // many rows on int8 activations: the block quantizer, then each grouped GEMM the variant has, bit for bit, for
     // row counts around its tiles, a panel's tail (N = 45), columns split at a panel, and groups of 128 and 256
    std::vector<int8_t> qv(M * K), qr(M * K);
    std::vector<float> sv(M * K / 128), sr(M * K / 128), ov(M * K / 128), orr(M * K / 128);
    v->quantize_x8_blocks(in.xb.data(), K, 0, M, qv.data(), sv.data(), ov.data());
    ref->quantize_x8_blocks(in.xb.data(), K, 0, M, qr.data(), sr.data(), orr.data());
    check(qv == qr && sv == sr && ov == orr, "int8 block quantizer, bit for bit");
    for (int g = 0; g < QS_FORMAT_COUNT; ++g) {
      if (!v->gemm_grouped_x8[g]) continue;
      for (int64_t group : {G, 2 * G})
        for (int64_t m : {int64_t(1), int64_t(3), int64_t(5), M}) {
          std::vector<float> yv(m * N), yr(m * N), ys(m * N);
          v->gemm_grouped_x8[g](qr.data(), sr.data(), orr.data(), in.w4.data(), in.scale.data(), in.offset.data(), group, m, K, N, 0, N, yv.data());
          ref->gemm_grouped_x8[g](qr.data(), sr.data(), orr.data(), in.w4.data(), in.scale.data(), in.offset.data(), group, m, K, N, 0, N, yr.data());
          v->gemm_grouped_x8[g](qr.data(), sr.data(), orr.data(), in.w4.data(), in.scale.data(), in.offset.data(), group, m, K, N, 0, 32, ys.data());
          v->gemm_grouped_x8[g](qr.data(), sr.data(), orr.data(), in.w4.data(), in.scale.data(), in.offset.data(), group, m, K, N, 32, N, ys.data());
          check(yv == yr && ys == yv, std::to_string(qs_format_bits(g)) + "-bit x int8 GEMM, group " + std::to_string(group) +
                ", " + std::to_string(m) + " rows, bit for bit", rel_err(yv, yr));
        }
    }
  }
  for (int g = 0; g < QS_FORMAT_COUNT; ++g) {
    if (!v->dequant_grouped[g]) continue;
    std::vector<uint16_t> dv(N * K), dr(N * K);
    v->dequant_grouped[g](in.w4.data(), in.scale.data(), in.offset.data(), G, K, 0, N, dv.data());
    ref->dequant_grouped[g](in.w4.data(), in.scale.data(), in.offset.data(), G, K, 0, N, dr.data());
    check(dv == dr, std::to_string(qs_format_bits(g)) + "-bit weights unpacked to bf16, bit for bit");
  }
  for (int gemma = 0; gemma < 2; ++gemma) {
    std::vector<float> yv(4 * 640), yr(4 * 640);
    v->rms_norm_f32(in.x.data(), in.wf.data(), 640, 1e-6f, gemma, 0, 4, yv.data());
    ref->rms_norm_f32(in.x.data(), in.wf.data(), 640, 1e-6f, gemma, 0, 4, yr.data());
    std::vector<uint16_t> bv(4 * 640), br(4 * 640);
    v->rms_norm_bf16(in.xb.data(), in.wb.data(), 640, 1e-6f, gemma, 0, 4, bv.data());
    ref->rms_norm_bf16(in.xb.data(), in.wb.data(), 640, 1e-6f, gemma, 0, 4, br.data());
    check(yv == yr && bv == br, std::string("rms_norm ") + (gemma ? "gemma" : "llama") + ", bit for bit");
  }
  for (int64_t D : {16, 64, 256}) {
    const int64_t L = 37, Q = 3;
    std::vector<float> q(in.x.begin(), in.x.begin() + 4 * Q * D), kv(in.wf.begin(), in.wf.begin() + 2 * 2 * L * D);
    const std::vector<float> a = attention(v, q, kv, Q, D, L), b = attention(ref, q, kv, Q, D, L);
    check(rel_err(a, b) < 1e-5, "attention f32, head dim " + std::to_string(D), rel_err(a, b));
    std::vector<uint16_t> qb(in.xb.begin(), in.xb.begin() + 4 * Q * D), kvb(in.wb.begin(), in.wb.begin() + 2 * 2 * L * D);
    const std::vector<float> c = attention(v, qb, kvb, Q, D, L), d = attention(ref, qb, kvb, Q, D, L);
    check(rel_err(c, d) < 1e-2, "attention bf16, head dim " + std::to_string(D), rel_err(c, d));
    // The last query alone over the full cache is the last of Q queries, bit for bit.
    std::vector<float> last(q.begin(), q.end());
    const int64_t H = 4;
    std::vector<float> lone;
    for (int64_t h = 0; h < H; ++h) lone.insert(lone.end(), q.begin() + (h * Q + Q - 1) * D, q.begin() + (h * Q + Q) * D);
    const std::vector<float> one = attention(v, lone, kv, 1, D, L);
    bool same = true;
    for (int64_t h = 0; h < H; ++h) same = same && memcmp(one.data() + h * D, a.data() + (h * Q + Q - 1) * D, D * 4) == 0;
    check(same, "attention: a query alone equals it among 3, head dim " + std::to_string(D));
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
