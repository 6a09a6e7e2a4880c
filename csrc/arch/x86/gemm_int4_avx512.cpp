// AVX-512 (F, BW, VL, DQ, VNNI) 4-bit kernels, also those of the avx512_bf16
// and amx levels.
//
// INT4_W4A8: a 64-byte load of b holds 128 values; its low nibbles are the
// even ones and its high nibbles the odd ones, so each row of a is first put
// in that order (per 128 values: the 64 even ones, then the 64 odd ones) and
// vpdpbusd multiplies the nibbles (unsigned) by a (signed) as they are. A
// 128-bit lane then covers 32 values, always within one group (groups are
// multiples of 32), so the int32 lanes of a step turn into fp32 times their
// chunk's group scale, and the zero points' part, zero * sum of a, is taken
// away once per output from per-chunk sums. The loop nest is loop_nest.h's.
//
// MXFP4: 32 values a step, a byte shuffle looks up twice each E2M1 value
// (an int8 in [-12, 12]), widened to fp32 times half the block's scale;
// every such value is exact in bf16, whose bits are then its top half.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "arch/x86/avx512_reduce.h"
#include "arch/x86/inline.h"
#include "arch/x86/kernels_x86.h"
#include "arch/x86/loop_nest.h"
#include "arch/x86/w4a8_operands.h"
#include "core/kernel_use.h"
#include "core/kernels.h"

namespace moe_xarch {
namespace {

constexpr int64_t kStepValues = 128;  // of K per step: one 64-byte load of b
constexpr int64_t kChunk = x86::kW4A8Chunk;

struct W4A8Tiles : x86::W4A8TileArgs<kStepValues> {
  static constexpr int kMR = 4;
  static constexpr int kNR = 4;
  static constexpr int kNR1 = 8;

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const x86::TileCols& cols, int64_t /*p0*/, int64_t k, bool /*first*/) {
    const x86::W4A8Columns<NR> col(ops, b, ldb, cols);
    const int64_t ahead = cols.ahead * ldb;
    const __m512i chunk_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 acc[MR][NR];
    for (int r = 0; r < MR; ++r) {
      for (int q = 0; q < NR; ++q) acc[r][q] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < k; p += kStepValues) {
      const int64_t bytes = k - p >= kStepValues ? 64 : (k - p) / 2;
      const __mmask64 lanes = bytes == 64 ? ~__mmask64{0} : (__mmask64{1} << bytes) - 1;
      __m512i even[MR], odd[MR];
      for (int r = 0; r < MR; ++r) {
        even[r] = _mm512_load_si512(ops.a + (i + r) * ops.lda + p);
        odd[r] = _mm512_load_si512(ops.a + (i + r) * ops.lda + p + 64);
      }
      for (int q = 0; q < NR; ++q) {
        if constexpr (MR == 1) __builtin_prefetch(col.b[q] + ahead + p / 2, 0, 3);
        const __m512i packed = _mm512_maskz_loadu_epi8(lanes, col.b[q] + p / 2);
        const __m512i lo = _mm512_and_si512(packed, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
        const __m512 scale = _mm512_permutexvar_ps(chunk_of_lane, _mm512_broadcast_f32x4(_mm_loadu_ps(col.scale[q] + p / kChunk)));
        for (int r = 0; r < MR; ++r) {
          __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, even[r]);
          dot = _mm512_dpbusd_epi32(dot, hi, odd[r]);
          acc[r][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r][q]);
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      const float* sums = ops.a_sums + (i + r) * ops.chunks;
      __m512 out[NR];
      for (int q = 0; q < NR; ++q) {
        __m512 zero_part = _mm512_setzero_ps();
        for (int64_t t = 0; t < ops.chunks; t += 16) {
          zero_part = _mm512_fmadd_ps(_mm512_loadu_ps(col.zero_scale[q] + t), _mm512_loadu_ps(sums + t), zero_part);
        }
        out[q] = _mm512_mul_ps(_mm512_sub_ps(acc[r][q], zero_part), _mm512_set1_ps(a_scale[i + r]));
      }
      x86::store_cols<NR>(c + (i + r) * ldc + cols.j, cols, false,
                          [&](float* dst, bool) { x86::store_sums_avx512<NR>(out, dst, cols.nb, false); });
    }
  }
};

}  // namespace

void avx512::gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                       const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmW4A8);
  const x86::W4A8Operands<kStepValues> ops(m, n, k, a, lda, groups);
  W4A8Tiles t{{ops, a_scale, b, ldb, c, ldc}};
  x86::gemm_tiled(t, m, n, k);
}

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

// store(dst + c, 16 fp32 values) for each 16 of cols values.
template <class T, class Store>
MOE_X86_INLINE void mxfp4_row(int64_t cols, const uint8_t* src, const uint8_t* scale, T* dst, Store store) {
  const __m128i table = e2m1_doubled(), low4 = _mm_set1_epi8(0x0f);
  for (int64_t c = 0; c < cols; c += 32) {
    const __m512 s = _mm512_set1_ps(half_e8m0(scale[c / 32]));
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c / 2));
    const __m128i lo = _mm_and_si128(packed, low4), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low4);
    const __m128i first = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi));
    const __m128i second = _mm_shuffle_epi8(table, _mm_unpackhi_epi8(lo, hi));
    store(dst + c, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(first)), s));
    store(dst + c + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(second)), s));
  }
}

}  // namespace

void avx512::mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst) {
  MOE_KERNEL_USE(kMxfp4ToBF16);
  mxfp4_row(cols, src, scale, dst, [](uint16_t* d, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
  });
}

void avx512::mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst) {
  MOE_KERNEL_USE(kMxfp4ToF32);
  mxfp4_row(cols, src, scale, dst, [](float* d, __m512 v) { _mm512_storeu_ps(d, v); });
}

}  // namespace moe_xarch
