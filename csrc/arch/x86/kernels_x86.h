// The x86_64 kernel levels, and the functions one level's file lends another.
// No intrinsics: included by cpu_features.cpp, compiled without ISA flags.
#pragma once

#include "core/kernels.h"

namespace moe_xarch {

// Each level's set: <level>::kernels().
#define MOE_LEVEL(level, test, flags, files) namespace level { const KernelSet& kernels(); }
#include "arch/x86/levels.def"
#undef MOE_LEVEL

// avx2: gemm_avx2.cpp, and gemm_mxfp4_avx2.cpp's MXFP4 kernels.
namespace avx2 {
void mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst);
void mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst);
void gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                     int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc);
bool gemm_bf16_mxfp4_takes(int64_t m);
}  // namespace avx2

// avx512: its 4-bit kernels (gemm_int4_avx512.cpp, gemm_mxfp4_avx512.cpp),
// amx's INT4 and MXFP4 GEMMs for few rows.
namespace avx512 {
void gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
               const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc);
void mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst);
void mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst);
void gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                     int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc);
bool gemm_bf16_mxfp4_takes(int64_t m);
}  // namespace avx512

// avx512_bf16: its fused MXFP4 GEMM (gemm_mxfp4_avx512_bf16.cpp).
namespace avx512_bf16 {
void gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                     int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc);
bool gemm_bf16_mxfp4_takes(int64_t m);
}  // namespace avx512_bf16

}  // namespace moe_xarch
