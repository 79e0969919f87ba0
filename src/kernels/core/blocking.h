// The blocking every SIMD variant shares: R weight rows against M rows of x, each weight register used
// for all M rows, so verifying k draft tokens reads W once per pass. Included by a variant after it has
// defined, for its vector types:
//   kRows (4), kMaxM (x rows per pass),
//   sum4(const Sum*) -> four lane sums, sum1(Sum) -> one, put(float* y, four sums, lanes),
// and its formats, each with: Acc, V, Sum (the type sums are kept in: Acc, or a float vector for a
// format whose integer sums are folded into fp32 once per span), kStep (values per madd), kSub (madd
// steps per weight load), State, zero(), sum_zero(), madd(), span(), begin(), at(), wv(), xv(),
// finish(), and, where it folds, kFolds and fold().
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

// Which cache the weights' prefetches fill: 3 (prefetcht0, L1) unless the build says otherwise
// (src/kernels/variants.py: prefetch_flags, L2 on x86 CPUs; QUANTSPEC_PREFETCH forces one): a core whose
// misses into L1 run out of fill buffers reads faster prefetching into L2.
#ifndef QS_PREFETCH_LOCALITY
#define QS_PREFETCH_LOCALITY 3
#endif

namespace qs {

// Every 64-byte line of weights is prefetched once, into L1, from the rows a whole number of blocks
// ahead, the fewest that put it at least kAheadBytes ahead in memory: the hardware's L2 streamer stops at
// every 4 KB page and does not keep ahead of short rows (Gemma 3's 640-byte head rows) by itself.
//
// Short rows (at most kShortRow bytes) are prefetched in address order: each step asks for the next R
// lines of the block ahead as one run, so the memory sees one sequential stream instead of R interleaved
// ones the hardware's prefetchers cannot follow over so few lines; the block ahead is then one further, so
// that its last row's lines are asked for kAheadBytes early too. Longer rows keep one line per row (in
// address order they were no faster). The measurements behind both are in docs/concepts/kernels.md.
constexpr int kShortRow = 2048;
constexpr int kAheadBytes = 6144;

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

// How many rows ahead (a whole number of blocks of R) a block of R rows prefetches: the fewest that put each
// line at least kAheadBytes ahead of its read; in address order (short rows) one block further, so that the
// block's last row too is asked for that early. block and one_row_groups both use it, so they prefetch the
// same lines.
inline int64_t rows_ahead(int R, int64_t row_bytes, bool in_order) {
  return R * std::max<int64_t>(1, (kAheadBytes + (in_order ? 2 * R - 1 : R) * row_bytes - 1) / (R * row_bytes));
}

// R weight rows from n0 against M rows of x from m0, into y [., N]. A folding format's integer sums
// start afresh each span and are folded into its float sums at the span's end.
template <int M, int R, typename F>
inline void block(const F& f, int m0, int64_t n0, float* y, int64_t N) {
  constexpr bool folds = Folds<F>::value;
  typename F::Sum sum[M][R];
  typename F::Acc acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) sum[m][r] = F::sum_zero();
  constexpr int U = F::kSub;
  const char* const base = reinterpret_cast<const char*>(f.at(n0, 0));
  const int64_t row_bytes = reinterpret_cast<const char*>(f.at(n0 + 1, 0)) - base;
  // bytes of a row per k step: a step under a line prefetches at the step that starts in each line
  const int64_t step_bytes = reinterpret_cast<const char*>(f.at(n0, F::kStep * U)) - base;
  const bool in_order = row_bytes <= kShortRow;
  const int64_t ahead_rows = rows_ahead(R, row_bytes, in_order);
  for (int64_t k0 = 0; k0 < f.K; k0 += f.span()) {
    const int64_t k1 = std::min(k0 + f.span(), f.K);
    typename F::State state[R];
    for (int r = 0; r < R; ++r) state[r] = f.begin(n0 + r, k0);
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) {
        if constexpr (folds) acc[m][r] = F::zero(); else acc[m][r] = sum[m][r];
      }
    for (int64_t k = k0; k < k1; k += F::kStep * U) {
      // A prefetch past the last row is harmless: prefetches never fault.
      if (in_order) {  // this step's share of the block ahead: the lines that start in it
        const uintptr_t lo = reinterpret_cast<uintptr_t>(f.at(n0 + ahead_rows, 0)) +
                             R * (reinterpret_cast<uintptr_t>(f.at(n0, k)) - reinterpret_cast<uintptr_t>(base));
        for (uintptr_t p = (lo + 63) & ~uintptr_t(63); p < lo + R * step_bytes; p += 64)
          __builtin_prefetch(reinterpret_cast<const void*>(p), 0, QS_PREFETCH_LOCALITY);
      } else {
        const char* ahead = reinterpret_cast<const char*>(f.at(n0 + ahead_rows, k));
        for (int r = 0; r < R; ++r, ahead += row_bytes) {
          if (step_bytes >= 64) {
            for (int64_t b = 0; b < step_bytes; b += 64) __builtin_prefetch(ahead + b, 0, QS_PREFETCH_LOCALITY);
          } else if ((reinterpret_cast<uintptr_t>(ahead) & 63) < static_cast<uintptr_t>(step_bytes)) {
            __builtin_prefetch(ahead, 0, QS_PREFETCH_LOCALITY);
          }
        }
      }
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

// Whether a format gives group_dot (one_row_groups below): the x86 variants' 4-, 5- and 6-bit formats.
template <typename F, typename = void> struct GroupDot { static constexpr bool value = false; };
template <typename F> struct GroupDot<F, std::void_t<decltype(&F::group_dot)>> { static constexpr bool value = true; };

// One row of x (a decode step) against a grouped format whose group is one load per row (F::kBits bits in
// groups of 128: 16 * kBits bytes), rows of at most kShortRow bytes (gemv below takes it where these hold).
// block<1, kRows> would run its span loop once per load, and that loop's bookkeeping (the group's scale found by
// a division, the prefetch loop's bounds, moves between registers) cost about as many instructions as the
// group's dot products; here each row's scales (f.scale, [N, K / group]) are walked by index and the block
// ahead's lines are prefetched in straight-line code.
// f.group_dot(w, row_bytes, g, acc) computes group g of kRows rows from w into acc (integer sums: exact in any
// order) and the prefetched lines are block's (those that start in the group's bytes of the block ahead), so
// the sums are block's bit for bit.
template <typename F>
void one_row_groups(const F& f, int64_t N, int64_t n0, int64_t n1, float* y) {
  const int64_t G = f.K / f.group, row_bytes = f.K * F::kBits / 8, group_bytes = kRows * f.group * F::kBits / 8;
  const int64_t ahead_rows = rows_ahead(kRows, row_bytes, true);
  int64_t n = n0;
  for (; n + kRows <= n1; n += kRows) {
    const uint8_t* w = f.w + n * row_bytes;
    const float* s = f.scale + n * G;
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(w + ahead_rows * row_bytes);
    typename F::Sum sum[kRows];
    for (int r = 0; r < kRows; ++r) sum[r] = F::sum_zero();
    for (int64_t g = 0; g < G; ++g) {
      const uintptr_t lo = ahead + group_bytes * g;
      for (uintptr_t p = (lo + 63) & ~uintptr_t(63); p < lo + group_bytes; p += 64)
        __builtin_prefetch(reinterpret_cast<const void*>(p), 0, QS_PREFETCH_LOCALITY);
      typename F::Acc acc[kRows];
      f.group_dot(w, row_bytes, g, acc);
      for (int r = 0; r < kRows; ++r) sum[r] = F::fold(sum[r], acc[r], s[r * G + g]);
    }
    put(y + n, f.finish(sum4(sum), n, 0, kRows), kRows);
  }
  for (; n < n1; ++n) block<1, 1>(f, 0, n, y, N);
}

// Many rows of x (a batch of sequences, a prompt's chunk) against a format that unpacks its weights (kSub steps
// per load) and folds its integer sums once per span: passes<kMaxM> would unpack every weight again for each
// kMaxM rows of x (AVX2: each pair). Here each block of kRows weight rows is unpacked once per span into a tile
// (in L1), which every row of x then streams over. Each (row of x, weight row) gets block's sums bit for bit:
// the same vectors meet the same x in each lane, its integer sums (exact in any order) fold at the same span ends.
// Where a variant defines QS_TILED (AVX2, whose 16 registers hold only 2 rows of x a pass).
constexpr int kTileMinM = 4;  // below this, passes' 2 rows a pass cost less than writing the tile

template <typename F>
void tiled(const F& f, int64_t M, int64_t n0, int64_t n1, float* y, int64_t N) {
  constexpr int U = F::kSub, R = kRows;
  const int64_t span = f.span(), per_load = int64_t(F::kStep) * U;
  thread_local std::vector<typename F::V> tile;  // [R][loads of a span][U]
  thread_local std::vector<typename F::Sum> sums;  // [M][R]
  tile.resize(R * ((span + per_load - 1) / per_load) * U);
  sums.resize(M * R);
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    for (int64_t i = 0; i < M * R; ++i) sums[i] = F::sum_zero();
    for (int64_t k0 = 0; k0 < f.K; k0 += span) {
      const int64_t k1 = std::min(k0 + span, f.K), loads = (k1 - k0) / per_load;
      typename F::State state[R];
      for (int r = 0; r < R; ++r) state[r] = f.begin(n + r, k0);
      for (int r = 0; r < R; ++r) {
        typename F::V* t = tile.data() + r * loads * U;
        for (int64_t l = 0; l < loads; ++l) {
          // the next block's row, at the same place: read once, from memory, as the step's stream is
          __builtin_prefetch(f.at(n + R + r, k0 + l * per_load), 0, QS_PREFETCH_LOCALITY);
          for (int u = 0; u < U; ++u) t[l * U + u] = weights(f, state[r], n + r, k0 + l * per_load, u);
        }
      }
      const typename F::V* tp = tile.data();
      for (int64_t m = 0; m < M; ++m) {
        typename F::Acc acc[R];
        for (int r = 0; r < R; ++r) acc[r] = F::zero();
        for (int64_t l = 0; l < loads; ++l)
#pragma GCC unroll 8
          for (int u = 0; u < U; ++u) {
            const typename F::V xv = f.xv(int(m), k0 + l * per_load + u * F::kStep);
            for (int r = 0; r < R; ++r) acc[r] = F::madd(acc[r], tp[(r * loads + l) * U + u], xv);
          }
        for (int r = 0; r < R; ++r) sums[m * R + r] = F::fold(sums[m * R + r], acc[r], state[r]);
      }
    }
    for (int64_t m = 0; m < M; ++m) put(y + m * N + n, f.finish(sum4(&sums[m * R]), n, int(m), R), R);
  }
  for (; n < n1; ++n)  // N's last rows, one at a time, as pass() takes them
    for (int64_t m = 0; m < M; ++m) block<1, 1>(f, int(m), n, y, N);
}

template <typename F>
void gemv(const F& f, int64_t M, int64_t N, int64_t n0, int64_t n1, float* y) {
  if constexpr (GroupDot<F>::value) {
    if (M == 1 && f.group == 128 && f.K * F::kBits / 8 <= kShortRow) return one_row_groups(f, N, n0, n1, y);  // a step
  }
#if defined(QS_TILED)
  if constexpr (Folds<F>::value && F::kSub > 1) {
    if (M >= kTileMinM) return tiled(f, M, n0, n1, y, N);
  }
#endif
  for (int m0 = 0; m0 < M; m0 += kMaxM) passes<kMaxM>(f, M, m0, n0, n1, y, N);
}

// A grouped weight-only format's gemv entry (api.h's gemv_grouped) for a variant whose grouped formats are built
// alike, x's part then the weight's (Grouped<B> in avx2.cpp, avx512.cpp and neon.cpp): the call's arguments as F,
// then gemv above.
template <typename F>
void grouped_gemv(const int16_t* xq, const float* x_scale, const float* group_sums, const uint8_t* w, const float* scale,
                  const float* offset, int64_t group, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  gemv(F{{{xq, K, x_scale}, w, scale, offset, group_sums, group}}, M, N, n0, n1, y);
}

}  // namespace qs
