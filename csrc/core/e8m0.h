// The values of MXFP4's E8M0 scales, for the kernels that multiply by them:
// kE8m0.value[s] = 2^(s - 127), subnormal for s == 0. Byte 255 (NaN) is
// refused by the argument checks, so no kernel meets it. And the E2M1 values
// they scale, for the kernels that look them up as fp32.
//
// Included by files compiled with ISA flags: no C++ library headers, and
// internal linkage (core/packed_layout.h says why).
#pragma once

#include <cstdint>

namespace moe_xarch {
namespace {

struct E8m0Values {
  float value[256];
};

constexpr E8m0Values make_e8m0_values() {
  E8m0Values t{};
  for (uint32_t s = 0; s < 255; ++s) t.value[s] = __builtin_bit_cast(float, s > 0 ? s << 23 : 0x00400000u);
  return t;
}

constexpr E8m0Values kE8m0 = make_e8m0_values();

// E2M1 value x: sign (bit 3), magnitude index (bits 0-2).
constexpr float kE2m1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                             -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// The low and high bytes of the bf16 bits of E2M1 value x (bytes 2 and 3 of
// its fp32 bits, below which it has only zeros), for the kernels that look
// them up by byte shuffles.
struct E2m1Bytes {
  uint8_t value[16];
};

constexpr E2m1Bytes make_e2m1_bf16_byte(int byte) {
  E2m1Bytes t{};
  for (int x = 0; x < 16; ++x) {
    t.value[x] = static_cast<uint8_t>(__builtin_bit_cast(uint32_t, kE2m1[x]) >> (16 + 8 * byte));
  }
  return t;
}

constexpr E2m1Bytes kE2m1Low = make_e2m1_bf16_byte(0);
constexpr E2m1Bytes kE2m1High = make_e2m1_bf16_byte(1);

}  // namespace
}  // namespace moe_xarch
