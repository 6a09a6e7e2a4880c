// The portable 4-bit kernels (the spec's "4-bit weights"): plain loops, the
// kernel of every level that has no vectorized one.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/e8m0.h"
#include "core/kernel_use.h"
#include "core/kernels.h"

namespace moe_xarch {
namespace {

int32_t nibble(const uint8_t* row, int64_t p) { return p % 2 == 0 ? row[p / 2] & 15 : row[p / 2] >> 4; }

template <class T, class Convert>
void mxfp4_row(int64_t cols, const uint8_t* src, const uint8_t* scale, T* dst, Convert convert) {
  for (int64_t c0 = 0; c0 < cols; c0 += 32) {
    const float s = std::ldexp(1.f, int{scale[c0 / 32]} - 127);
    for (int64_t c = c0; c < c0 + 32; ++c) dst[c] = convert(kE2m1[nibble(src, c)] * s);
  }
}

uint16_t float_to_bf16(float value) {  // the values here are exact in bf16 or inf
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace

void generic::gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                        const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmW4A8);
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* row_a = a + i * lda;
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* row_b = b + j * ldb;
      float acc = 0.f;
      for (int64_t g = 0; g * groups.group < k; ++g) {
        int32_t dot = 0, sum_a = 0;
        for (int64_t p = g * groups.group; p < (g + 1) * groups.group; ++p) {
          dot += nibble(row_b, p) * row_a[p];
          sum_a += row_a[p];
        }
        const int32_t zero = groups.zero ? groups.zero[j * groups.ld + g] : 8;
        acc += groups.scale[j * groups.ld + g] * static_cast<float>(dot - zero * sum_a);
      }
      c[i * ldc + j] = acc * a_scale[i];
    }
  }
}

void generic::mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst) {
  MOE_KERNEL_USE(kMxfp4ToBF16);
  mxfp4_row(cols, src, scale, dst, float_to_bf16);
}

void generic::mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst) {
  MOE_KERNEL_USE(kMxfp4ToF32);
  mxfp4_row(cols, src, scale, dst, [](float v) { return v; });
}

}  // namespace moe_xarch
