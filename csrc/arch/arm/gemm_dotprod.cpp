// Armv8.2-A dot product (SDOT): int8 and INT4_W4A8 four products per lane per
// instruction. fp32, bf16 and MXFP4 have nothing new at this level and stay
// on NEON's kernels.
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>

#include "arch/arm/kernels_arm.h"
#include "arch/arm/w4a8.h"
#include "core/kernel_use.h"
#include "core/kernels.h"

namespace moe_xarch {
namespace {

struct S8DotOps : S8Io {
  static Acc mac(Acc acc, Vec a, Vec b) { return vdotq_s32(acc, a, b); }
};

struct W4A8Dot {
  static int32x4_t chunk(int32x4_t acc, int8x16_t even, int8x16_t odd, int8x16_t a_even, int8x16_t a_odd) {
    return vdotq_s32(vdotq_s32(acc, even, a_even), odd, a_odd);
  }
};

}  // namespace

// b_sum is unused: SDOT is signed times signed.
void dotprod::gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                      const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c,
                      int64_t ldc) {
  if (k < S8DotOps::kW) {
    return neon::gemm_s8(m, n, k, a, lda, a_scale, b, ldb, b_scale, b_sum, c, ldc);
  }
  MOE_KERNEL_USE(kGemmS8);
  gemm_dot<S8DotOps, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc, a_scale, b_scale);
}

void dotprod::gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                        const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmW4A8);
  gemm_w4a8_tiled<W4A8Dot, 4, 4, 8>(m, n, k, a, lda, a_scale, b, ldb, groups, c, ldc);
}

const KernelSet& dotprod::kernels() {
  static const KernelSet kernels = above(neon::kernels(), [](KernelSet& set) {
    set.gemm_s8 = gemm_s8;
    set.gemm_w4a8 = gemm_w4a8;
  });
  return kernels;
}

}  // namespace moe_xarch
