// e4m3 to fp16 with AVX2, for the levels that widen fp8 through fp16. In an
// anonymous namespace (loop_nest.h says why); no C++ library headers.
#pragma once

#if !(defined(__AVX2__) && defined(__F16C__))
#error "compiled only under the avx2 level flags and above (sources.cmake)"
#endif

#include <immintrin.h>

#include "arch/x86/inline.h"

namespace moe_xarch::x86 {
namespace {

// e4m3 bytes, sign-extended to 16-bit lanes, as the fp16 bit patterns of
// value * 2^-8: exponent and mantissa move into fp16's wider fields as they
// are (the biases differ by 8), so every value converts exactly, denormals
// included. The NaN pattern (exponent and mantissa all ones) becomes fp16 NaN.
MOE_X86_INLINE __m256i e4m3_to_fp16(__m256i x) {
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16(static_cast<short>(0xbf80)));
  const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x3f80));
  return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7c00)));
}

// The fp32 scale that turns e4m3_to_fp16's values into weights.
MOE_X86_INLINE float fp16_scale(float block_scale) { return block_scale * 256.f; }

}  // namespace
}  // namespace moe_xarch::x86
