// AVX-512 reductions and the fp8 row widening, for the avx512 and avx512_bf16
// files. In an anonymous namespace (loop_nest.h says why); no C++ library headers.
#pragma once

#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__))
#error "compiled only under the avx512 level flags and above (sources.cmake)"
#endif

#include <immintrin.h>

#include "arch/x86/e4m3_fp16.h"
#include "arch/x86/inline.h"

namespace moe_xarch::x86 {
namespace {


// Halves by extract rather than _mm512_cast*: GCC 12's casts set off
// -Wmaybe-uninitialized inside its own headers.
MOE_X86_INLINE __m256 fold_ps(__m512 v) {
  return _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
}

MOE_X86_INLINE __m256i fold_epi32(__v16si v) {
  const __m512i x = reinterpret_cast<__m512i>(v);
  return _mm256_add_epi32(_mm512_extracti32x8_epi32(x, 0), _mm512_extracti32x8_epi32(x, 1));
}

// Lane c of the result = the sum of the lanes of v[c].
MOE_X86_INLINE __m128 hsum4_ps(const __m512 (&v)[4]) {
  const __m256 t0 = _mm256_hadd_ps(fold_ps(v[0]), fold_ps(v[1]));
  const __m256 t1 = _mm256_hadd_ps(fold_ps(v[2]), fold_ps(v[3]));
  const __m256 t = _mm256_hadd_ps(t0, t1);
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

MOE_X86_INLINE __m256 hsum8_ps(const __m512 (&v)[8]) {
  const __m256 t0 = _mm256_hadd_ps(fold_ps(v[0]), fold_ps(v[1]));
  const __m256 t1 = _mm256_hadd_ps(fold_ps(v[2]), fold_ps(v[3]));
  const __m256 t2 = _mm256_hadd_ps(fold_ps(v[4]), fold_ps(v[5]));
  const __m256 t3 = _mm256_hadd_ps(fold_ps(v[6]), fold_ps(v[7]));
  const __m256 u0 = _mm256_hadd_ps(t0, t1);
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

MOE_X86_INLINE __m128i hsum4_epi32(const __v16si (&v)[4]) {
  const __m256i t0 = _mm256_hadd_epi32(fold_epi32(v[0]), fold_epi32(v[1]));
  const __m256i t1 = _mm256_hadd_epi32(fold_epi32(v[2]), fold_epi32(v[3]));
  const __m256i t = _mm256_hadd_epi32(t0, t1);
  return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

MOE_X86_INLINE __m256i hsum8_epi32(const __v16si (&v)[8]) {
  const __m256i t0 = _mm256_hadd_epi32(fold_epi32(v[0]), fold_epi32(v[1]));
  const __m256i t1 = _mm256_hadd_epi32(fold_epi32(v[2]), fold_epi32(v[3]));
  const __m256i t2 = _mm256_hadd_epi32(fold_epi32(v[4]), fold_epi32(v[5]));
  const __m256i t3 = _mm256_hadd_epi32(fold_epi32(v[6]), fold_epi32(v[7]));
  const __m256i u0 = _mm256_hadd_epi32(t0, t1);
  const __m256i u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

// One fp8 row, 16 values at a time: store(dst + c, fp32 values, lane mask).
template <class T, class Store>
MOE_X86_INLINE void fp8_row_avx512(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k,
                                   T* dst, Store store) {
  for (int64_t c0 = 0; c0 < cols; c0 += block_k) {
    const int64_t c1 = cols - c0 < block_k ? cols : c0 + block_k;
    const __m512 s = _mm512_set1_ps(fp16_scale(scale[c0 / block_k]));
    for (int64_t c = c0; c < c1; c += 16) {
      const __mmask16 lanes = c1 - c >= 16 ? 0xffff : static_cast<__mmask16>((1u << (c1 - c)) - 1);
      const __m256i h = e4m3_to_fp16(_mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(lanes, src + c)));
      store(dst + c, _mm512_mul_ps(_mm512_cvtph_ps(h), s), lanes);
    }
  }
}

template <int NR>
MOE_X86_INLINE void store_sums_avx512(const __m512 (&acc)[NR], float* c, int nb, bool add) {
  static_assert(NR == 4 || NR == 8, "tiles are 4 or 8 rows of b wide");
  const __mmask8 cols = static_cast<__mmask8>((1u << nb) - 1);
  if constexpr (NR == 4) {
    __m128 v = hsum4_ps(acc);
    if (add) v = _mm_add_ps(v, _mm_maskz_loadu_ps(cols, c));
    _mm_mask_storeu_ps(c, cols, v);
  } else {
    __m256 v = hsum8_ps(acc);
    if (add) v = _mm256_add_ps(v, _mm256_maskz_loadu_ps(cols, c));
    _mm256_mask_storeu_ps(c, cols, v);
  }
}

}  // namespace
}  // namespace moe_xarch::x86
