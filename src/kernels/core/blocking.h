// The blocking every SIMD variant shares: R weight rows against M rows of x, each weight register used
// for all M rows, so verifying k draft tokens reads W once per pass. Included by a variant after it has
// defined, for its vector types:
//   kRows (4), kMaxM (x rows per pass), kAhead (rows prefetched ahead),
//   sum4(const Sum*) -> four lane sums, sum1(Sum) -> one, put(float* y, four sums, lanes),
// and its formats, each with: Acc, V, Sum (the type sums are kept in: Acc, or a float vector for a
// format whose integer sums are folded into fp32 once per span), kStep (values per madd), kSub (madd
// steps per weight load), State, zero(), sum_zero(), madd(), span(), begin(), at(), wv(), xv(),
// finish(), and, where it folds, kFolds and fold().
#pragma once

#include <algorithm>
#include <type_traits>

namespace qs {

// Besides the next block's rows into L1, the bytes kFarBytes ahead into L2. Rows are contiguous, so short
// rows (Gemma 3's head: 262144 x 640) cross a 4 KB page every few rows, where the hardware's L2 streamer
// stops and starts again; prefetches into L1 alone are capped by its few fill buffers. Measured on the
// head, in turns: AVX2 w8a8 9.7 -> 4.8 ms, bf16 16.9 -> 7.9 ms; AVX-512 w8a8 9.2 -> 6.1 ms (4 and 8 KB
// ahead gained less, 32 KB the same); no loss on Llama-2-7B's long rows.
constexpr int kFarBytes = 16384;

template <typename F, typename = void> struct Folds { static constexpr bool value = false; };
template <typename F> struct Folds<F, std::void_t<decltype(F::kFolds)>> { static constexpr bool value = F::kFolds; };

// A format with kSub > 1 loads once per kSub steps and hands out one step's weights at a time.
template <typename F>
inline typename F::V weights(const F& f, const typename F::State& s, int64_t n, int64_t k, int u) {
  if constexpr (F::kSub > 1) return f.wv(s, n, k, u); else return f.wv(s, n, k);
}

// The order of a load's steps: F::order(u) where a format has one (AVX2's int4 takes the steps of one
// 32-byte half before the other's, so fewer loaded halves stay live in its 16 registers), else 0, 1, ...
// Only integer sums may be reordered: they are exact in any order.
template <typename F, typename = void> struct Ordered { static constexpr int at(int u) { return u; } };
template <typename F> struct Ordered<F, std::void_t<decltype(F::order(0))>> {
  static constexpr int at(int u) { return F::order(u); }
};

// R weight rows from n0 against M rows of x from m0, into y [., N]. A folding format's integer sums
// start afresh each span and are folded into its float sums at the span's end.
template <int M, int R, typename F>
inline void block(const F& f, int m0, int64_t n0, float* y, int64_t N) {
  constexpr bool folds = Folds<F>::value;
  typename F::Sum sum[M][R];
  typename F::Acc acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) sum[m][r] = F::sum_zero();
  for (int64_t k0 = 0; k0 < f.K; k0 += f.span()) {
    const int64_t k1 = std::min(k0 + f.span(), f.K);
    typename F::State state[R];
    for (int r = 0; r < R; ++r) state[r] = f.begin(n0 + r, k0);
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) {
        if constexpr (folds) acc[m][r] = F::zero(); else acc[m][r] = sum[m][r];
      }
    constexpr int U = F::kSub;
    for (int64_t k = k0; k < k1; k += F::kStep * U) {
      // A prefetch past the last row is harmless: prefetches never fault.
      for (int r = 0; r < R; ++r) __builtin_prefetch(f.at(n0 + r + kAhead, k), 0, 3);
      for (int r = 0; r < R; ++r) __builtin_prefetch(reinterpret_cast<const char*>(f.at(n0 + r, k)) + kFarBytes, 0, 2);
#pragma GCC unroll 8
      for (int i = 0; i < U; ++i) {
        const int u = Ordered<F>::at(i);
        typename F::V wv[R];
        for (int r = 0; r < R; ++r) wv[r] = weights(f, state[r], n0 + r, k, u);
        for (int m = 0; m < M; ++m) {
          const typename F::V xv = f.xv(m0 + m, k + u * F::kStep);
          for (int r = 0; r < R; ++r) acc[m][r] = F::madd(acc[m][r], wv[r], xv);
        }
      }
    }
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) {
        if constexpr (folds) sum[m][r] = F::fold(sum[m][r], acc[m][r], state[r]); else sum[m][r] = acc[m][r];
      }
  }
  for (int m = 0; m < M; ++m) {
    if constexpr (R == 4) put(y + (m0 + m) * N + n0, f.finish(sum4(sum[m]), n0, m0 + m, 4), 4);
    else put(y + (m0 + m) * N + n0, f.finish(sum1(sum[m][0]), n0, m0 + m, 1), 1);
  }
}

// Columns n0..n1 (n0 a multiple of kRows): whole blocks, then the last rows one at a time (only at N's
// end, as the caller splits N at multiples of 4).
template <int M, typename F>
void pass(const F& f, int m0, int64_t n0, int64_t n1, float* y, int64_t N) {
  int64_t n = n0;
  for (; n + kRows <= n1; n += kRows) block<M, kRows>(f, m0, n, y, N);
  for (; n < n1; ++n) block<M, 1>(f, m0, n, y, N);
}

template <int P, typename F>
void passes(const F& f, int64_t M, int m0, int64_t n0, int64_t n1, float* y, int64_t N) {
  if constexpr (P > 1) {
    if (M - m0 < P) return passes<P - 1>(f, M, m0, n0, n1, y, N);
  }
  pass<P>(f, m0, n0, n1, y, N);
}

template <typename F>
void gemv(const F& f, int64_t M, int64_t N, int64_t n0, int64_t n1, float* y) {
  for (int m0 = 0; m0 < M; m0 += kMaxM) passes<kMaxM>(f, M, m0, n0, n1, y, N);
}

}  // namespace qs
