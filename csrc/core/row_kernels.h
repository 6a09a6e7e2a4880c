// The driver's per-row loops (phase 2's activations, the int8 quantization of
// activation rows, phase 3's weighted sums) in portable C++. KernelSet defaults
// to the generic level's build; a level with wider vectors exports its own
// (compiled_here), the anonymous namespace giving each its own copy, counted as
// its level's. Branch-free and built with -fno-trapping-math, so GCC vectorizes
// them (under -ftrapping-math it keeps any loop with arithmetic on a min or max scalar).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/kernel_use.h"
#include "core/kernels.h"

namespace moe_xarch::row_kernels {
namespace {

// Adding and taking away 1.5 * 2^23 rounds a float of magnitude below 2^22 to
// an integer, half to even as nearbyint does, in plain arithmetic the compiler
// vectorizes (nearbyint is a library call without SSE4.1).
constexpr float kRoundToInteger = 12582912.f;

// e^x to within 2 ulp (Cephes' expf: x = n ln 2 + r, a degree-6 polynomial
// in r, 2^n put into the exponent); std::exp is a library call per value.
inline __attribute__((always_inline)) float exp_approx(float x) {
  // x is clamped to [-87, 88] on its bits, by integer min: a float min is a
  // select, and GCC pushes the division that follows into both of its arms,
  // dividing every lane by the constant e^88 too - a denormal result, and a
  // microcode assist on every lane.
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits = std::min(bits, 0xc2ae0000u);  // -87.f; negative floats order by magnitude as unsigned
  bits = static_cast<uint32_t>(std::min(static_cast<int32_t>(bits), 0x42b00000));  // 88.f
  std::memcpy(&x, &bits, sizeof(x));
  const float n = (x * 1.44269504f + kRoundToInteger) - kRoundToInteger;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float e_r = poly * r * r + r + 1.f;
  const int32_t two_n_bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &two_n_bits, sizeof(two_n));
  return e_r * two_n;
}

void silu_and_mul(int64_t n, const float* gate, const float* up, const float* gate_bias, const float* up_bias,
                  float* out) {
  MOE_KERNEL_USE(kSiluAndMul);
  for (int64_t j = 0; j < n; ++j) {
    const float g = gate[j] + gate_bias[j];
    out[j] = g / (1.f + exp_approx(-g)) * (up[j] + up_bias[j]);
  }
}

// gpt-oss's clamped SwiGLU on interleaved (gate, up) pairs h[2j], h[2j + 1].
void swiglu(int64_t n, const float* h, const float* bias, float alpha, float limit, float* out) {
  MOE_KERNEL_USE(kSwiglu);
  for (int64_t j = 0; j < n; ++j) {
    const float gate = std::min(h[2 * j] + bias[2 * j], limit);
    const float up = std::min(std::max(h[2 * j + 1] + bias[2 * j + 1], -limit), limit);
    out[j] = gate / (1.f + exp_approx(-alpha * gate)) * (up + 1.f);
  }
}

// q = round(x / scale) with scale = max|x| / 127, NaNs skipped.
void quantize_row_s8(int64_t n, const float* x, int8_t* q, float* scale) {
  MOE_KERNEL_USE(kQuantizeRowS8);
  // The largest |x| as the bits of a non-negative float, which order as
  // integers do: an integer max, which vectorizes where a float max may not.
  int32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    bits &= 0x7fffffff;
    amax_bits = std::max(amax_bits, bits <= 0x7f800000 ? bits : 0);
  }
  float amax;
  std::memcpy(&amax, &amax_bits, sizeof(amax));
  const float s = std::max(amax, 1e-10f) / 127.f;
  // x / s lies in [-127, 127].
  for (int64_t i = 0; i < n; ++i) {
    const float rounded = (x[i] / s + kRoundToInteger) - kRoundToInteger;
    q[i] = static_cast<int8_t>(std::min(std::max(rounded, -127.f), 127.f));
  }
  *scale = s;
}

// An expert's output row into its token's sum.
void add_weighted(int64_t n, float weight, const float* c, const float* bias, float* dst) {
  MOE_KERNEL_USE(kAddWeighted);
  for (int64_t j = 0; j < n; ++j) dst[j] += weight * (c[j] + bias[j]);
}

// Puts this translation unit's row loops in a level's set.
constexpr void compiled_here(KernelSet& set) {
  set.silu_and_mul = silu_and_mul;
  set.swiglu = swiglu;
  set.quantize_row_s8 = quantize_row_s8;
  set.add_weighted = add_weighted;
}

}  // namespace
}  // namespace moe_xarch::row_kernels
