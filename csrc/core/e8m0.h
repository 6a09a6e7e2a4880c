// The values of MXFP4's E8M0 scales, for the kernels that multiply by them:
// kE8m0.value[s] = 2^(s - 127), subnormal for s == 0. Byte 255 (NaN) is
// refused by the argument checks, so no kernel meets it.
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

}  // namespace
}  // namespace moe_xarch
