// AVX-512 (F, BW, VL, DQ, VNNI) INT4_W4A8 kernel, also that of the
// avx512_bf16 and amx levels (MXFP4's: gemm_mxfp4_avx512.cpp).
//
// INT4_W4A8: a 64-byte load of b holds 128 values; its low nibbles are the
// even ones and its high nibbles the odd ones, so each row of a is first put
// in that order (per 128 values: the 64 even ones, then the 64 odd ones) and
// vpdpbusd multiplies the nibbles (unsigned) by a (signed) as they are. A
// 128-bit lane then covers 32 values, always within one group (groups are
// multiples of 32), so the int32 lanes of a step turn into fp32 times their
// chunk's group scale, and the zero points' part, zero * sum of a, is taken
// away once per output from per-chunk sums. The loop nest is loop_nest.h's.
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

}  // namespace moe_xarch
