// The aarch64 baseline (Armv8-A Advanced SIMD): fp32 by FMA, bf16 widened to
// fp32, int8 by widening multiplies. Every aarch64 CPU runs this level, and
// the higher levels fall back to it for k below their vector width.
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "arch/arm/kernels_arm.h"
#include "core/kernel_use.h"
#include "core/kernels.h"

namespace moe_xarch {
namespace {

struct F32Ops {
  using T = float;
  using Vec = float32x4_t;
  using Acc = float32x4_t;
  static constexpr int kW = 4;
  static constexpr bool kScaled = false;
  static Acc zero() { return vdupq_n_f32(0.f); }
  static Vec load(const float* p) { return vld1q_f32(p); }
  static Vec load_keep(const float* p, uint8x16_t keep) {
    return vreinterpretq_f32_u8(vandq_u8(vld1q_u8(reinterpret_cast<const uint8_t*>(p)), keep));
  }
  static Acc mac(Acc acc, Vec a, Vec b) { return vfmaq_f32(acc, a, b); }
};

// bf16 is the high half of an fp32, so a 16-bit widening shift is exact.
struct BF16Ops {
  using T = uint16_t;
  using Vec = float32x4x2_t;
  using Acc = float32x4_t;
  static constexpr int kW = 8;
  static constexpr bool kScaled = false;
  static Vec widen(uint16x8_t x) {
    return {{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16)),
             vreinterpretq_f32_u32(vshll_high_n_u16(x, 16))}};
  }
  static Acc zero() { return vdupq_n_f32(0.f); }
  static Vec load(const uint16_t* p) { return widen(vld1q_u16(p)); }
  static Vec load_keep(const uint16_t* p, uint8x16_t keep) {
    const uint8x16_t bytes = vandq_u8(vld1q_u8(reinterpret_cast<const uint8_t*>(p)), keep);
    return widen(vreinterpretq_u16_u8(bytes));
  }
  static Acc mac(Acc acc, Vec a, Vec b) {
    return vfmaq_f32(vfmaq_f32(acc, a.val[0], b.val[0]), a.val[1], b.val[1]);
  }
};

// Each int16 product goes straight into int32 (SADALP). Pairing two products
// in int16 first (SMLAL) would save an instruction but overflows for
// (-128 * -128) * 2, and int8 GEMMs here must be exact for any input.
struct S8Ops : S8Io {
  static Acc mac(Acc acc, Vec a, Vec b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
  }
};

float bf16_to_f32(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// k shorter than one vector: plain loops (Acc is float or int32_t).
template <class Acc, class T, class Widen>
void gemm_short_k(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
                  int64_t ldb, float* c, int64_t ldc, const float* a_scale, const float* b_scale,
                  Widen widen) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      Acc acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += widen(a[i * lda + p]) * widen(b[j * ldb + p]);
      float v = static_cast<float>(acc);
      if (a_scale) v = v * a_scale[i] * b_scale[j];
      c[i * ldc + j] = v;
    }
  }
}

}  // namespace

void gemm_f32_neon(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmF32);
  if (k < F32Ops::kW) {
    return gemm_short_k<float>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr,
                               [](float x) { return x; });
  }
  gemm_dot<F32Ops, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr);
}

void gemm_bf16_neon(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                    const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16);
  if (k < BF16Ops::kW) {
    return gemm_short_k<float>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr, bf16_to_f32);
  }
  gemm_dot<BF16Ops, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr);
}

// b_sum is unused: signed times signed needs no correction term.
void gemm_s8_neon(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda,
                  const float* a_scale, const int8_t* b, int64_t ldb, const float* b_scale,
                  const int32_t* /*b_sum*/, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmS8);
  if (k < S8Ops::kW) {
    return gemm_short_k<int32_t>(m, n, k, a, lda, b, ldb, c, ldc, a_scale, b_scale,
                                 [](int8_t x) { return int32_t{x}; });
  }
  gemm_dot<S8Ops, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc, a_scale, b_scale);
}

const KernelSet& kernels_neon() {
  static const KernelSet kernels{gemm_f32_neon, gemm_bf16_neon, gemm_s8_neon};
  return kernels;
}

}  // namespace moe_xarch
