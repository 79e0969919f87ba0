// AMX (Intel Xeon since Sapphire Rapids): the int8 GEMM of many rows, a w8a8 prefill or perplexity window,
//   y[M, N] = float(x_q[M, K] . w[N, K]^T) * x_scale[m] * w_scale[n]
// on the tile unit: TDPBSSD multiplies a 16 x 64 int8 tile by a 64 x 16 one into 16 x 16 int32 sums (16K
// multiply-adds an instruction, where VPDPBUSD does 64). The sums are exact, the two scales applied in the
// order ATen's path applies them (src.quant.linear.W8A8Linear), so the result is that path's bit for bit.
//
// The weight stays as stored, [N, K] row-major: its rows are the A tiles (16 output channels x 64 bytes of
// K), so no second copy of it is kept. x is the B operand, which AMX takes in 4-byte groups along K
// (a tile row holds K values 4r..4r+3 of 16 rows of x): quantize_x8_tiles writes it so while quantizing,
// and the C tiles come out transposed (output channel, row), stored through a small buffer.
//
// Its own library, apart from the gemv variants (api.h): it is a GEMM for prefill, present only where the
// CPU has AMX, and Linux must grant each process the tile state first (request()).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "amx.h"
#include "common.h"

namespace {

using namespace qs;

constexpr int64_t kTile = 16;    // rows of a tile, and output columns of a C tile
constexpr int64_t kDepth = 64;   // bytes of K a tile row holds
constexpr int64_t kPair = 2 * kTile;  // 2 x 2 C tiles per step: 2 A tiles and 2 B tiles reused twice each

int request(int feature) {
  constexpr int kReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM (asm/prctl.h)
  return syscall(SYS_arch_prctl, kReqXcompPerm, feature) == 0 ? 0 : errno;
}

// The bytes x_q [M, K] takes in tile order: whole tile pairs of rows (zeros past M).
int64_t tiles_bytes(int64_t M, int64_t K) { return (M + kPair - 1) / kPair * kPair * K; }

// Rows r0..r1 of x (r0 a multiple of 16) quantized as common.h's quant8 (scale = max|x| / 127, round half to
// even: qparams.int8_per_token's values exactly), written as B tiles: tile (row block b, K block c) at
// (b * K / 64 + c) * 1024 bytes, its row r holding K values 64c + 4r .. + 3 of its 16 rows, 4 bytes each.
void quantize_x8_tiles(const float* x, int64_t M, int64_t K, int64_t r0, int64_t r1, int8_t* q, float* x_scale) {
  for (int64_t m = r0; m < r1; ++m) {
    int8_t* block = q + (m / kTile) * kTile * K + (m % kTile) * 4;
    if (m >= M) {  // padding rows of the last pair: zeros
      for (int64_t k = 0; k < K; k += 4) std::memset(block + (k / kDepth) * kTile * kDepth + (k % kDepth) / 4 * kDepth, 0, 4);
      continue;
    }
    const float* row = x + m * K;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(row + k)));
    const float scale = std::max(_mm512_reduce_max_ps(amax), kX8Floor) / 127.f;
    x_scale[m] = scale;
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t k = 0; k < K; k += 16) {
      __m512i v = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(row + k), s));  // MXCSR: nearest-even
      v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
      alignas(16) int32_t four[4];  // 16 values: four groups of 4 bytes, each to its own tile row
      _mm_store_si128(reinterpret_cast<__m128i*>(four), _mm512_cvtepi32_epi8(v));
      int8_t* tile = block + (k / kDepth) * kTile * kDepth + (k % kDepth) / 4 * kDepth;
      for (int g = 0; g < 4; ++g) std::memcpy(tile + g * kDepth, &four[g], 4);
    }
  }
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C (output channel block i, row block j at 2 i + j); 4, 5: A (the weight's two channel blocks);
// 6, 7: B (x's two row blocks). Every tile 16 rows of 64 bytes.
void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// c [16 channels][16 rows] (a C tile: channel nb + i, row mb + j at c[i * 16 + j]) transposed in registers (four
// rounds of shuffles) so that each row of y takes 16 contiguous channels, scaled as ATen's path scales:
// (float(sum) * x_scale) * w_scale.
void finish(const int32_t* c, const float* x_scale, const float* w_scale, int64_t M, int64_t N, int64_t mb, int64_t nb,
            float* y) {
  const int64_t rows = std::min<int64_t>(kTile, M - mb), cols = std::min<int64_t>(kTile, N - nb);
  if (rows <= 0 || cols <= 0) return;
  __m512i r[16], a[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c + 16 * i);
  for (int k = 0; k < 8; ++k) {
    a[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {  // r[4k + q], lane L: channels 4k..4k+3 of row 4L + q
    r[4 * k] = _mm512_unpacklo_epi64(a[4 * k], a[4 * k + 2]);
    r[4 * k + 1] = _mm512_unpackhi_epi64(a[4 * k], a[4 * k + 2]);
    r[4 * k + 2] = _mm512_unpacklo_epi64(a[4 * k + 1], a[4 * k + 3]);
    r[4 * k + 3] = _mm512_unpackhi_epi64(a[4 * k + 1], a[4 * k + 3]);
  }
  for (int q = 0; q < 4; ++q) {  // a[j]: row j's 16 channels
    const __m512i lo0 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0x44), lo1 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0x44);
    const __m512i hi0 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0xEE), hi1 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0xEE);
    a[q] = _mm512_shuffle_i32x4(lo0, lo1, 0x88);
    a[4 + q] = _mm512_shuffle_i32x4(lo0, lo1, 0xDD);
    a[8 + q] = _mm512_shuffle_i32x4(hi0, hi1, 0x88);
    a[12 + q] = _mm512_shuffle_i32x4(hi0, hi1, 0xDD);
  }
  const __mmask16 keep = cols == 16 ? 0xFFFF : __mmask16((1u << cols) - 1);
  const __m512 ws = _mm512_maskz_loadu_ps(keep, w_scale + nb);
  for (int64_t j = 0; j < rows; ++j) {
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a[j]), _mm512_set1_ps(x_scale[mb + j])), ws);
    _mm512_mask_storeu_ps(y + (mb + j) * N + nb, keep, v);
  }
}

// Columns n0..n1 of y, every row (n0 a multiple of 32). The weight's 32 rows of a step are read from memory once
// and then from cache for each pair of row blocks; a last partial pair is copied into zero-padded rows first
// (a tile load of 16 rows would read past the weight's end).
void gemm_s8(const int8_t* xt, const float* x_scale, const int8_t* w, const float* w_scale, int64_t M, int64_t K,
             int64_t N, int64_t n0, int64_t n1, float* y) {
  configure();
  std::vector<int8_t> tail;
  alignas(64) int32_t c[kTile * kTile];
  const int64_t Mp = (M + kPair - 1) / kPair * kPair, blocks = K / kDepth;
  for (int64_t n = n0; n < n1; n += kPair) {
    const int8_t* wn = w + n * K;
    if (n + kPair > N) {
      tail.assign(kPair * K, 0);
      std::memcpy(tail.data(), wn, (N - n) * K);
      wn = tail.data();
    }
    for (int64_t m = 0; m < Mp; m += kPair) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const int8_t* b0 = xt + m * K;
      const int8_t* b1 = b0 + kTile * K;
      for (int64_t cb = 0; cb < blocks; ++cb) {
        _tile_loadd(4, wn + cb * kDepth, K);
        _tile_loadd(5, wn + kTile * K + cb * kDepth, K);
        _tile_loadd(6, b0 + cb * kTile * kDepth, kDepth);
        _tile_loadd(7, b1 + cb * kTile * kDepth, kDepth);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      }
      for (int t = 0; t < 4; ++t) {
        switch (t) {  // _tile_stored takes its tile as a constant
          case 0: _tile_stored(0, c, 64); break;
          case 1: _tile_stored(1, c, 64); break;
          case 2: _tile_stored(2, c, 64); break;
          default: _tile_stored(3, c, 64); break;
        }
        finish(c, x_scale, w_scale, M, N, m + (t & 1) * kTile, n + (t >> 1) * kTile, y);
      }
    }
  }
  _tile_release();
}

const qs_amx table = {QS_AMX_ABI, request, tiles_bytes, quantize_x8_tiles, gemm_s8};

}  // namespace

extern "C" const qs_amx* qs_amx_get(void) { return &table; }
