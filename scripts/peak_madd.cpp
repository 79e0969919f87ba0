// The host's ceiling for w4a16's and w8a16's inner instruction: on AVX2 VPMADDWD (16 int16 products summed in
// pairs) and VPADDD, and where the CPU has AVX512-VNNI its VPDPWSSD on 512 bits (32 products, the sum fused), each
// into 8 independent accumulators, nothing loaded, on 1 thread and then on 2. The serving concept page's bounds
// (docs/concepts/serving.md, Limits) were read from it:
//
//   g++ -O2 -mavx2 -pthread scripts/peak_madd.cpp -o /tmp/peak_madd && /tmp/peak_madd
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

static int run(long iters) {
  __m256i acc[8], w = _mm256_set1_epi16(3), x = _mm256_set1_epi16(5);
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (auto& a : acc) {
      a = _mm256_add_epi32(a, _mm256_madd_epi16(w, x));
      asm volatile("" : "+x"(a));  // kept: the compiler may not fold the loop away
    }
    asm volatile("" : "+x"(w), "+x"(x));
  }
  int s = 0;
  for (auto& a : acc) s += _mm256_extract_epi32(a, 0);
  return s;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int run512(long iters) {
  __m512i acc[8], w = _mm512_set1_epi16(3), x = _mm512_set1_epi16(5);
  for (auto& a : acc) a = _mm512_setzero_si512();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (auto& a : acc) {
      a = _mm512_dpwssd_epi32(a, w, x);
      asm volatile("" : "+v"(a));
    }
    asm volatile("" : "+v"(w), "+v"(x));
  }
  int s = 0;
  for (auto& a : acc) s += _mm_cvtsi128_si32(_mm512_castsi512_si128(a));
  return s;
}

template <typename Fn>
static void measure(const char* what, Fn fn, double per_iter) {
  const long iters = 200000000;
  for (int threads : {1, 2}) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) pool.emplace_back([&] { fn(iters); });
    for (auto& t : pool) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%d thread(s): %.1f billion int16 multiply-adds a second (%s)\n", threads,
                threads * iters * per_iter / s / 1e9, what);
  }
}

int main() {
  measure("VPMADDWD + VPADDD", run, 8.0 * 16);
  if (__builtin_cpu_supports("avx512vnni")) measure("VPDPWSSD, 512 bits", run512, 8.0 * 32);
}
