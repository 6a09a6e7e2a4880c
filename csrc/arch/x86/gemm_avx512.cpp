// AVX-512 (F, BW, VL, DQ, VNNI) kernels: 4x4 register tiles of 16-lane fp32 or
// int32 accumulators along K (1x8 for m = 1), K tails by masked loads. The
// loop nest around the tiles is loop_nest.h's.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own
// -Wmaybe-uninitialized then reports once inlined (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "arch/x86/avx512_reduce.h"
#include "arch/x86/kernels_x86.h"
#include "arch/x86/loop_nest.h"
#include "core/kernel_use.h"
#include "core/kernels.h"
#include "core/row_kernels.h"

namespace moe_xarch {
namespace {

using x86::store_sums_avx512;

MOE_X86_INLINE __mmask16 mask16(int rem) { return static_cast<__mmask16>((1u << rem) - 1); }
MOE_X86_INLINE __mmask32 mask32(int rem) { return static_cast<__mmask32>((1ull << rem) - 1); }
MOE_X86_INLINE __mmask64 mask64(int rem) { return static_cast<__mmask64>((1ull << rem) - 1); }

struct F32 {
  using T = float;
  using A = __m512;
  using B = __m512;
  using Acc = __m512;
  static constexpr int kStep = 16;
  static MOE_X86_INLINE Acc zero() { return _mm512_setzero_ps(); }
  static MOE_X86_INLINE A load_a(const T* p) { return _mm512_loadu_ps(p); }
  static MOE_X86_INLINE A load_a_tail(const T* p, int rem) {
    return _mm512_maskz_loadu_ps(mask16(rem), p);
  }
  static MOE_X86_INLINE B load_b(const T* p) { return load_a(p); }
  static MOE_X86_INLINE B load_b_tail(const T* p, int rem) { return load_a_tail(p, rem); }
  static MOE_X86_INLINE void madd(Acc& acc, A a, B b) { acc = _mm512_fmadd_ps(a, b, acc); }
  template <int NR>
  static MOE_X86_INLINE void store(const Acc (&acc)[NR], float* c, int nb, bool add) {
    store_sums_avx512<NR>(acc, c, nb, add);
  }
};

// bf16 widened to fp32 in registers. The even values of a 32-value load become
// fp32 by a shift, the odd ones by clearing their low half; a dot product may
// pair them in any order as long as a and b are split alike.
struct BF16 {
  using T = uint16_t;
  struct A {
    __m512 even, odd;
  };
  using B = A;
  using Acc = __m512;
  static constexpr int kStep = 32;
  static MOE_X86_INLINE A split(__m512i x) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  static MOE_X86_INLINE Acc zero() { return _mm512_setzero_ps(); }
  static MOE_X86_INLINE A load_a(const T* p) { return split(_mm512_loadu_si512(p)); }
  static MOE_X86_INLINE A load_a_tail(const T* p, int rem) {
    return split(_mm512_maskz_loadu_epi16(mask32(rem), p));
  }
  static MOE_X86_INLINE B load_b(const T* p) { return load_a(p); }
  static MOE_X86_INLINE B load_b_tail(const T* p, int rem) { return load_a_tail(p, rem); }
  static MOE_X86_INLINE void madd(Acc& acc, A a, B b) {
    acc = _mm512_fmadd_ps(a.even, b.even, acc);
    acc = _mm512_fmadd_ps(a.odd, b.odd, acc);
  }
  template <int NR>
  static MOE_X86_INLINE void store(const Acc (&acc)[NR], float* c, int nb, bool add) {
    store_sums_avx512<NR>(acc, c, nb, add);
  }
};

// VNNI multiplies unsigned a by signed b: a ^ 0x80 is a + 128 as u8, so the
// dot product comes out 128 * sum(b) too high.
struct S8 {
  using T = int8_t;
  using A = __m512i;
  using B = __m512i;
  // Not __m512i (64-bit lanes): GCC 12 then copies every accumulator of
  // vpdpbusd once per iteration.
  using Acc = __v16si;
  static constexpr int kStep = 64;
  static MOE_X86_INLINE __m512i bias() { return _mm512_set1_epi8(static_cast<char>(0x80)); }
  static MOE_X86_INLINE Acc zero() { return Acc{}; }
  static MOE_X86_INLINE A load_a(const T* p) { return _mm512_xor_si512(_mm512_loadu_si512(p), bias()); }
  // Lanes past the tail turn into 128, against zeros of b.
  static MOE_X86_INLINE A load_a_tail(const T* p, int rem) {
    return _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask64(rem), p), bias());
  }
  static MOE_X86_INLINE B load_b(const T* p) { return _mm512_loadu_si512(p); }
  static MOE_X86_INLINE B load_b_tail(const T* p, int rem) {
    return _mm512_maskz_loadu_epi8(mask64(rem), p);
  }
  static MOE_X86_INLINE void madd(Acc& acc, A a, B b) {
    acc = reinterpret_cast<Acc>(_mm512_dpbusd_epi32(reinterpret_cast<__m512i>(acc), a, b));
  }
  static MOE_X86_INLINE void sum_b(Acc& acc, B b) { madd(acc, _mm512_set1_epi8(1), b); }
};

template <int NR>
MOE_X86_INLINE auto hsum_epi32(const __v16si (&v)[NR]) {
  if constexpr (NR == 4) {
    return x86::hsum4_epi32(v);
  } else {
    return x86::hsum8_epi32(v);
  }
}

// K is never cut into blocks: the scales apply to the whole int32 dot.
struct S8Tiles {
  static constexpr int kMR = 4;
  static constexpr int kNR = 4;
  static constexpr int kNR1 = 8;
  using T = int8_t;
  static constexpr int64_t kKBlock = 0;

  const int8_t* a;
  int64_t lda;
  const float* a_scale;
  const int8_t* b;
  int64_t ldb;
  const float* b_scale;
  const int32_t* b_sum;
  float* c;
  int64_t ldc;
  // Sums of the current rows of b, when the caller has none.
  alignas(32) int32_t sums[kNR1];

  int64_t row_bytes() const { return ldb; }

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const x86::TileCols& cols, int64_t /*p0*/, int64_t k, bool first) {
    // Two whole paths rather than a join after the loop, which GCC pays for
    // with spilled accumulators.
    if (b_sum == nullptr && first) {
      run<MR, NR, true>(i, cols, k);
    } else {
      run<MR, NR, false>(i, cols, k);
    }
  }

  template <int MR, int NR, bool kSumB>
  MOE_X86_INLINE void run(int64_t i, const x86::TileCols& cols, int64_t k) {
    static_assert(NR == 4 || NR == 8, "tiles are 4 or 8 rows of b wide");
    const x86::TileRows<int8_t, MR, NR> rows(a + i * lda, lda, b + cols.j * ldb, ldb, cols);
    S8::Acc acc[MR][NR];
    S8::Acc bsum[NR];
    x86::dot_tile<S8, MR, NR, kSumB>(k, rows, acc, bsum);
    // Scales and sums of the tile's columns, gathered when they are strided.
    const float* scales = b_scale + cols.j;
    const int32_t* given = b_sum != nullptr ? b_sum + cols.j : sums;
    alignas(32) float strided_scales[NR];
    alignas(32) int32_t strided_sums[NR];
    if (cols.stride != 1) {
      for (int q = 0; q < cols.nb; ++q) {
        strided_scales[q] = b_scale[cols.j + q * cols.stride];
        if (b_sum != nullptr) strided_sums[q] = b_sum[cols.j + q * cols.stride];
      }
      scales = strided_scales;
      if (b_sum != nullptr) given = strided_sums;
    }
    const __mmask8 lanes = static_cast<__mmask8>((1u << cols.nb) - 1);
    if constexpr (NR == 4) {
      __m128i sum;
      if constexpr (kSumB) {
        sum = hsum_epi32<NR>(bsum);
        _mm_store_si128(reinterpret_cast<__m128i*>(sums), sum);
      } else {
        sum = _mm_maskz_loadu_epi32(lanes, given);
      }
      const __m128i bias = _mm_slli_epi32(sum, 7);
      const __m128 scale = _mm_maskz_loadu_ps(lanes, scales);
      for (int r = 0; r < MR; ++r) {
        const __m128i dot = _mm_sub_epi32(hsum_epi32<NR>(acc[r]), bias);
        const __m128 v =
            _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(dot), _mm_set1_ps(a_scale[i + r])), scale);
        x86::store_cols<NR>(c + (i + r) * ldc + cols.j, cols, false,
                            [&](float* dst, bool) { _mm_mask_storeu_ps(dst, lanes, v); });
      }
    } else {
      __m256i sum;
      if constexpr (kSumB) {
        sum = hsum_epi32<NR>(bsum);
        _mm256_store_si256(reinterpret_cast<__m256i*>(sums), sum);
      } else {
        sum = _mm256_maskz_loadu_epi32(lanes, given);
      }
      const __m256i bias = _mm256_slli_epi32(sum, 7);
      const __m256 scale = _mm256_maskz_loadu_ps(lanes, scales);
      for (int r = 0; r < MR; ++r) {
        const __m256i dot = _mm256_sub_epi32(hsum_epi32<NR>(acc[r]), bias);
        const __m256 v =
            _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(a_scale[i + r])), scale);
        x86::store_cols<NR>(c + (i + r) * ldc + cols.j, cols, false,
                            [&](float* dst, bool) { _mm256_mask_storeu_ps(dst, lanes, v); });
      }
    }
  }
};

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16);
  x86::gemm_float<BF16, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc);
}

// One block of scale 1: exact, as bf16 holds every e4m3 value; fp32 to bf16
// rounding to nearest even all the same (the values are finite or quiet NaN).
void fp8_to_bf16(int64_t cols, const uint8_t* src, uint16_t* dst) {
  MOE_KERNEL_USE(kFp8ToBF16);
  static constexpr float kUnscaled = 1.f;
  x86::fp8_row_avx512(cols, src, &kUnscaled, cols, dst, [](uint16_t* d, __m512 v, __mmask16 lanes) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    _mm256_mask_storeu_epi16(d, lanes, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
  });
}

void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmF32);
  x86::gemm_float<F32, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc);
}

void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale, const int8_t* b,
             int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmS8);
  S8Tiles t{a, lda, a_scale, b, ldb, b_scale, b_sum, c, ldc, {}};
  x86::gemm_tiled(t, m, n, k);
}

void fp8_to_f32(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k, float* dst) {
  MOE_KERNEL_USE(kFp8ToF32);
  x86::fp8_row_avx512(cols, src, scale, block_k, dst,
                      [](float* d, __m512 v, __mmask16 lanes) { _mm512_mask_storeu_ps(d, lanes, v); });
}

}  // namespace

const KernelSet& avx512::kernels() {
  static const KernelSet kernels = above(avx2::kernels(), [](KernelSet& set) {
    row_kernels::compiled_here(set);
    set.gemm_f32 = gemm_f32;
    set.gemm_bf16 = gemm_bf16;
    set.gemm_s8 = gemm_s8;
    set.fp8_to_bf16 = fp8_to_bf16;
    set.fp8_to_f32 = fp8_to_f32;
    // No fused fp8 GEMM: fp8 rows are widened (fp8_to_bf16) for gemm_bf16.
    set.gemm_bf16_fp8 = nullptr;
    set.gemm_bf16_fp8_takes = takes_no_rows;
    set.gemm_w4a8 = gemm_w4a8;
    set.mxfp4_to_bf16 = mxfp4_to_bf16;
    set.mxfp4_to_f32 = mxfp4_to_f32;
    set.gemm_bf16_mxfp4 = gemm_bf16_mxfp4;
    set.gemm_bf16_mxfp4_takes = gemm_bf16_mxfp4_takes;
  });
  return kernels;
}

}  // namespace moe_xarch
