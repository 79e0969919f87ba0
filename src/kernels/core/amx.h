// The AMX library's interface (amx.cpp): like api.h's, a table of plain C functions over raw buffers, so the
// library is built with its own ISA flags and loaded only where the CPU has AMX.
#pragma once

#include <stdint.h>

#define QS_AMX_ABI 1

extern "C" {

typedef struct qs_amx {
  int abi;  // QS_AMX_ABI
  // Ask Linux for the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, feature); 18 is XTILEDATA), once per process
  // before any tile instruction: 0, or the errno of its refusal.
  int (*request)(int feature);
  // Bytes of x [M, K] in tile order (rows padded with zeros to a multiple of 32).
  int64_t (*tiles_bytes)(int64_t M, int64_t K);
  // Rows r0..r1 (r0 a multiple of 16; up to the padded row count) of x [M, K] (K a multiple of 64) quantized
  // per row to int8 (scale = max|x| / 127, round half to even) into the tile order, x_scale [M].
  void (*quantize_x8_tiles)(const float* x, int64_t M, int64_t K, int64_t r0, int64_t r1, int8_t* q,
                            float* x_scale);
  // y [M, N] float32, columns n0..n1 (n0 a multiple of 32): float(x_q . w^T) * x_scale[m] * w_scale[n].
  void (*gemm_s8)(const int8_t* x_tiles, const float* x_scale, const int8_t* w, const float* w_scale, int64_t M,
                  int64_t K, int64_t N, int64_t n0, int64_t n1, float* y);
} qs_amx;

__attribute__((visibility("default"))) const qs_amx* qs_amx_get(void);

}  // extern "C"
