// e4m3 to bf16 by byte tables (AVX512-VBMI lookups), and the fp8 line
// layout's widening into bf16 tiles, for the avx512_bf16 and amx files. In an
// anonymous namespace (loop_nest.h says why); no C++ library headers.
#pragma once

#if !(defined(__AVX512BF16__) && defined(__AVX512VBMI__))
#error "compiled only under the avx512_bf16 level flags and above (sources.cmake)"
#endif

#include <immintrin.h>

#include "arch/x86/inline.h"
#include "core/packed_layout.h"

namespace moe_xarch::x86 {
namespace {


// The bf16 bit pattern of the e4m3 magnitude m (sign bit clear). Every e4m3
// value, subnormals included, is a normal bf16 with the same mantissa bits;
// the NaN pattern (exponent and mantissa all ones) stays NaN.
constexpr uint16_t e4m3_magnitude_bf16(int m) {
  if (m == 0x7f) return 0x7fc0;
  int exponent = (m >> 3) - 7;  // a normal value is (1 + mantissa / 8) * 2^exponent
  int mantissa = m & 7;
  if (m >> 3 == 0) {  // subnormal: mantissa * 2^-9, normalized
    if (mantissa == 0) return 0;
    exponent = -6;
    while (mantissa < 8) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 7;
  }
  return static_cast<uint16_t>((exponent + 127) << 7 | mantissa << 4);
}

// Byte tables for E4m3ToBF16: the low and the high bytes of
// e4m3_magnitude_bf16 over all 128 magnitudes; the interleave that puts each
// value's low byte next to its high byte, per half of 64 values; and the
// in-lane shuffle from 4-byte groups of 4 rows to the line layout's order.
struct E4m3Tables {
  alignas(64) uint8_t low[128];
  alignas(64) uint8_t high[128];
  alignas(64) uint8_t interleave[2][64];  // [half]
  alignas(64) uint8_t groups_to_lines[64];
};

constexpr E4m3Tables make_e4m3_tables() {
  E4m3Tables t{};
  for (int m = 0; m < 128; ++m) {
    t.low[m] = static_cast<uint8_t>(e4m3_magnitude_bf16(m) & 0xff);
    t.high[m] = static_cast<uint8_t>(e4m3_magnitude_bf16(m) >> 8);
  }
  for (int half = 0; half < 2; ++half) {
    for (int w = 0; w < 32; ++w) {
      t.interleave[half][2 * w] = static_cast<uint8_t>(32 * half + w);
      t.interleave[half][2 * w + 1] = static_cast<uint8_t>(64 + 32 * half + w);
    }
  }
  for (int lane = 0; lane < 4; ++lane) {
    for (int r = 0; r < 4; ++r) {
      for (int p = 0; p < 4; ++p) {
        t.groups_to_lines[16 * lane + fp8_line_byte(r, p)] = static_cast<uint8_t>(4 * r + p);
      }
    }
  }
  return t;
}

constexpr E4m3Tables kE4m3Tables = make_e4m3_tables();

// 64 e4m3 bytes widened exactly to bf16. Two 128-entry byte lookups
// (vpermi2b, which ignores the sign bit), the sign OR-ed into the high bytes,
// then a byte interleave per half; NaN needs no special case.
struct E4m3ToBF16 {
  struct Halves {
    __m512bh first, second;
  };

  __m512i low0 = _mm512_load_si512(kE4m3Tables.low);
  __m512i low1 = _mm512_load_si512(kE4m3Tables.low + 64);
  __m512i high0 = _mm512_load_si512(kE4m3Tables.high);
  __m512i high1 = _mm512_load_si512(kE4m3Tables.high + 64);
  __m512i first_half = _mm512_load_si512(kE4m3Tables.interleave[0]);
  __m512i second_half = _mm512_load_si512(kE4m3Tables.interleave[1]);
  __m512i groups_to_lines = _mm512_load_si512(kE4m3Tables.groups_to_lines);

  // Values [0, 32) in `first`, [32, 64) in `second`; a caller that uses only
  // `first` pays for one interleave.
  MOE_X86_INLINE Halves operator()(__m512i bytes) const {
    const __m512i low = low_bytes(bytes), high = high_bytes(bytes);
    return {reinterpret_cast<__m512bh>(_mm512_permutex2var_epi8(low, first_half, high)),
            reinterpret_cast<__m512bh>(_mm512_permutex2var_epi8(low, second_half, high))};
  }

  // 64 bytes in the fp8 line layout's order (fp8_line_byte): the low 8 bytes
  // of each 128-bit lane widen into `first`, the high 8 into `second`, in
  // place. Interleaving within lanes takes one uop where vpermt2b takes three
  // (two on port 5, which the lookups also need).
  MOE_X86_INLINE Halves in_lanes(__m512i bytes) const {
    const __m512i low = low_bytes(bytes), high = high_bytes(bytes);
    return {reinterpret_cast<__m512bh>(_mm512_unpacklo_epi8(low, high)),
            reinterpret_cast<__m512bh>(_mm512_unpackhi_epi8(low, high))};
  }

  // 16 rows' 4-byte groups (row r in bytes [4 r, 4 r + 4)) into two rows of a
  // bf16 tile: each row's first pair of values in `first`, its second in `second`.
  MOE_X86_INLINE Halves groups(__m512i bytes) const {
    return in_lanes(_mm512_shuffle_epi8(bytes, groups_to_lines));
  }

  MOE_X86_INLINE __m512i low_bytes(__m512i bytes) const { return _mm512_permutex2var_epi8(low0, bytes, low1); }

  // The looked-up high byte | (bytes & sign bit).
  MOE_X86_INLINE __m512i high_bytes(__m512i bytes) const {
    return _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, bytes, high1), bytes,
                                     _mm512_set1_epi8(static_cast<char>(0x80)), 0xf8);
  }

  // 32 bytes (the first `lanes` of them; the rest read as zero).
  MOE_X86_INLINE __m512bh first32(const uint8_t* src, __mmask32 lanes) const {
    return (*this)(_mm512_maskz_loadu_epi8(lanes, src)).first;
  }
};

// One 16-row block of fp8 b in the line layout (fp8_line_byte), every line
// that k reaches rounded up to 32 values (the padding is zeros), widened
// exactly into bf16 in the tile layout (core/packed_layout.h): line q into the
// 64-byte lines 2 q and 2 q + 1 - contiguous tiles for AMX, one stream for
// AVX-512.
MOE_X86_INLINE void widen_fp8_lines(const E4m3ToBF16& e4m3_to_bf16, const uint8_t* block, int64_t k,
                                    uint8_t* panel) {
  constexpr int64_t kAhead = 1024;  // the next call's block, near the end: work items walk down the rows
  const int64_t lines = (k + 31) / 32 * 32 / 4;
  for (int64_t q = 0; q < lines; ++q) {
    _mm_prefetch(reinterpret_cast<const char*>(block + 64 * q + kAhead), _MM_HINT_T0);
    const auto pairs = e4m3_to_bf16.in_lanes(_mm512_loadu_si512(block + 64 * q));
    _mm512_store_si512(panel + 128 * q, reinterpret_cast<__m512i>(pairs.first));
    _mm512_store_si512(panel + 128 * q + 64, reinterpret_cast<__m512i>(pairs.second));
  }
}

}  // namespace
}  // namespace moe_xarch::x86
