// The MXFP4 code of the AVX-512 levels: the exact widening of a block of 32
// values, and the step the fused GEMMs of avx512 and avx512_bf16 share
// (mxfp4_tiles.h's Op but for A, decode and madd): 128 values of K, one 64-byte
// load of b whose 128-bit lanes are its 4 blocks of 32. Both levels' lookups
// keep each value in its block's lane, so lane l of 16 takes block l / 4's
// scale. In an anonymous namespace (loop_nest.h says why).
#pragma once
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__))
#error "compiled only under the avx512 level flags and above (sources.cmake)"
#endif
#include <immintrin.h>

#include <cstdint>

#include "arch/x86/inline.h"

namespace moe_xarch::x86 {
namespace {

// Twice each E2M1 value, by its nibble.
MOE_X86_INLINE __m128i e2m1_doubled() {
  return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

// 2^(s - 128): half the E8M0 scale s, subnormal for s < 2.
MOE_X86_INLINE float half_e8m0(uint8_t s) {
  const uint32_t bits = s >= 2 ? static_cast<uint32_t>(s - 1) << 23 : 0x00400000u >> (1 - s);
  float value;
  __builtin_memcpy(&value, &bits, sizeof(value));
  return value;
}

// The 32 values of one block (its 16 bytes at src, scale s) in K's order, as
// fp32: a byte shuffle looks up twice each E2M1 value (an int8 in [-12, 12]),
// widened to fp32 times half the block's scale, exactly.
MOE_X86_INLINE void mxfp4_block(const uint8_t* src, uint8_t s, __m512 (&v)[2]) {
  const __m128i table = e2m1_doubled(), low4 = _mm_set1_epi8(0x0f);
  const __m512 scale = _mm512_set1_ps(half_e8m0(s));
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  const __m128i lo = _mm_and_si128(packed, low4), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low4);
  const __m128i first = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi));
  const __m128i second = _mm_shuffle_epi8(table, _mm_unpackhi_epi8(lo, hi));
  v[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(first)), scale);
  v[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(second)), scale);
}

// mxfp4_block as bf16, whose bits are the fp32 values' top halves (every such
// value is exact in bf16): the block's 16 values, times its scale as
// mxfp4_block does, are a table whose top halves (even 16-bit words after a
// shift) each nibble indexes.
MOE_X86_INLINE __m512i mxfp4_block_bf16(const uint8_t* src, uint8_t s) {
  const __m512 doubled = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e2m1_doubled()));  // a constant, folded
  const __m512 values = _mm512_mul_ps(doubled, _mm512_set1_ps(half_e8m0(s)));
  const __m512i table = _mm512_srli_epi32(_mm512_castps_si512(values), 16);
  // Byte x holds values 2 x (low nibble) and 2 x + 1: dword x gets their
  // table words, 2 lo and 2 hi, as its two halves.
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  const __m512i index = _mm512_ternarylogic_epi32(_mm512_slli_epi32(bytes, 1), _mm512_slli_epi32(bytes, 13),
                                                  _mm512_set1_epi32(0x001e001e), 0xa8);  // (A | B) & C
  return _mm512_permutexvar_epi16(index, table);
}

struct Mxfp4StepAvx512 {
  static constexpr int64_t kStep = 128;
  using Acc = __m512;

  // The step's first `bytes` (a multiple of 16) bytes of b; zeros, value 0, past them.
  static MOE_X86_INLINE __m512i load(const uint8_t* b, int64_t bytes) {
    return bytes == 64 ? _mm512_loadu_si512(b) : _mm512_maskz_loadu_epi8((__mmask64{1} << bytes) - 1, b);
  }

  static MOE_X86_INLINE Acc zero() { return _mm512_setzero_ps(); }

  // The step's `values` (a multiple of 32) bf16 values of a row of a, in four
  // vectors; zeros past them.
  static MOE_X86_INLINE void load_a(const uint16_t* a, int64_t values, __m512i (&x)[4]) {
    for (int j = 0; j < 4; ++j) x[j] = 32 * j < values ? _mm512_loadu_si512(a + 32 * j) : _mm512_setzero_si512();
  }

  // 2^(s - 127) for the blocks' scales s, by lane: s in the fp32 exponent
  // field, exactly, for s >= 1; s = 0's 2^-127 is the subnormal 0x00400000,
  // which an unsigned max with it gives, every normal's bits being larger.
  // Blocks past the row's end read as s = 0.
  static MOE_X86_INLINE Acc scales(const uint8_t* s, int64_t blocks) {
    const __m128i bytes = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << blocks) - 1), s);
    const __m128i spread = _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    const __m512i exponent = _mm512_slli_epi32(_mm512_cvtepu8_epi32(spread), 23);
    return _mm512_castsi512_ps(_mm512_max_epu32(exponent, _mm512_set1_epi32(0x00400000)));
  }

  static MOE_X86_INLINE Acc scaled(Acc acc, Acc s, Acc total) { return _mm512_fmadd_ps(acc, s, total); }

  // Once per tile row: a plain reduction is as fast as any here.
  template <int NR>
  static MOE_X86_INLINE void store(const Acc (&total)[NR], float* c, int nb) {
    for (int q = 0; q < nb; ++q) c[q] = _mm512_reduce_add_ps(total[q]);
  }
};

}  // namespace
}  // namespace moe_xarch::x86
