// The x86_64 kernel levels, and the functions one level's file lends another.
// No intrinsics: included by cpu_features.cpp, compiled without ISA flags.
#pragma once

#include "core/kernels.h"

namespace moe_xarch {

const KernelSet& kernels_avx2();
const KernelSet& kernels_avx512();
const KernelSet& kernels_avx512_bf16();
const KernelSet& kernels_amx();

// The avx512_bf16 level differs from avx512 in its bf16 GEMM and fp8 to bf16
// conversion only.
namespace avx512 {
void fp8_to_f32(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k, float* dst);
void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc);
void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
             const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c,
             int64_t ldc);
// The 4-bit kernels of every AVX-512 level (gemm_int4_avx512.cpp, gemm_mxfp4_avx512.cpp;
// avx512_bf16 has a fused MXFP4 GEMM of its own).
void gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
               const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc);
void mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst);
void mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst);
void gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                     int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc);
bool gemm_bf16_mxfp4_takes(int64_t m);
namespace {
// `set` with them: how each AVX-512 level takes them.
constexpr KernelSet with_four_bit(KernelSet set) {
  set.gemm_w4a8 = gemm_w4a8;
  set.mxfp4_to_bf16 = mxfp4_to_bf16;
  set.mxfp4_to_f32 = mxfp4_to_f32;
  set.gemm_bf16_mxfp4 = gemm_bf16_mxfp4;
  set.gemm_bf16_mxfp4_takes = gemm_bf16_mxfp4_takes;
  return set;
}
}  // namespace
}  // namespace avx512

// gemm_mxfp4_avx512_bf16.cpp: the fused MXFP4 GEMM of the avx512_bf16 and amx levels.
namespace avx512_bf16 {
void gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                     int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc);
bool gemm_bf16_mxfp4_takes(int64_t m);
}  // namespace avx512_bf16

// gemm_mxfp4_avx2.cpp: the avx2 level's MXFP4 kernels.
namespace avx2 {
void mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst);
void mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst);
void gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                     int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc);
bool gemm_bf16_mxfp4_takes(int64_t m);
}  // namespace avx2

}  // namespace moe_xarch
