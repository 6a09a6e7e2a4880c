// The portable kernels: plain loops the compiler may vectorize for the
// architecture's baseline. Every architecture builds them (the "generic"
// level, the first of every ladder), so the same answers are always one
// MOE_XARCH_ISA away; csrc/arch/other/ is the port that has nothing else.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/kernel_use.h"
#include "core/kernels.h"
#include "core/row_kernels.h"

namespace moe_xarch {
namespace {

float bf16_to_float(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

uint16_t float_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

float e4m3_to_float(uint8_t bits) {
  const int exponent = (bits >> 3) & 15, mantissa = bits & 7;
  float value;
  if ((bits & 0x7f) == 0x7f) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    value = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  }
  return bits & 0x80 ? -value : value;
}

void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmF32);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t p = 0; p < k; ++p) acc += a[i * lda + p] * b[j * ldb + p];
      c[i * ldc + j] = acc;
    }
  }
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t p = 0; p < k; ++p) acc += bf16_to_float(a[i * lda + p]) * bf16_to_float(b[j * ldb + p]);
      c[i * ldc + j] = acc;
    }
  }
}

void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
             const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* /*b_sum*/, float* c,
             int64_t ldc) {
  MOE_KERNEL_USE(kGemmS8);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      int32_t acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += int32_t{a[i * lda + p]} * int32_t{b[j * ldb + p]};
      c[i * ldc + j] = static_cast<float>(acc) * a_scale[i] * b_scale[j];
    }
  }
}

}  // namespace

void generic::fp8_to_bf16(int64_t cols, const uint8_t* src, uint16_t* dst) {
  MOE_KERNEL_USE(kFp8ToBF16);
  for (int64_t c = 0; c < cols; ++c) dst[c] = float_to_bf16(e4m3_to_float(src[c]));
}

void generic::fp8_to_f32(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k, float* dst) {
  MOE_KERNEL_USE(kFp8ToF32);
  for (int64_t c = 0; c < cols; ++c) dst[c] = e4m3_to_float(src[c]) * scale[c / block_k];
}

void generic::silu_and_mul(int64_t n, const float* gate, const float* up, const float* gate_bias,
                           const float* up_bias, float* out) {
  row_kernels::silu_and_mul(n, gate, up, gate_bias, up_bias, out);
}

void generic::swiglu(int64_t n, const float* h, const float* bias, float alpha, float limit, float* out) {
  row_kernels::swiglu(n, h, bias, alpha, limit, out);
}

void generic::quantize_row_s8(int64_t n, const float* x, int8_t* q, float* scale) {
  row_kernels::quantize_row_s8(n, x, q, scale);
}

void generic::add_weighted(int64_t n, float weight, const float* c, const float* bias, float* dst) {
  row_kernels::add_weighted(n, weight, c, bias, dst);
}

bool takes_no_rows(int64_t) { return false; }

const KernelSet& generic::kernels() {
  static const KernelSet kernels{gemm_f32, gemm_bf16, gemm_s8};
  return kernels;
}

}  // namespace moe_xarch
