// AVX-512 BF16: the avx512 level with its bf16 GEMM on vdpbf16ps, which
// multiplies pairs of adjacent K values - a dot product's own order, and fp8
// widened to bf16 by vcvtneps2bf16. The rest is avx512's.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own
// -Wmaybe-uninitialized then reports once inlined (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "arch/x86/kernels_x86.h"
#include "core/kernels.h"

namespace moe_kernels {
namespace {

struct DpBF16 {
  using T = uint16_t;
  using A = __m512bh;
  using B = __m512bh;
  using Acc = __m512;
  static constexpr int kStep = 32;
  static MOE_X86_INLINE Acc zero() { return _mm512_setzero_ps(); }
  static MOE_X86_INLINE A load_a(const T* p) { return reinterpret_cast<A>(_mm512_loadu_si512(p)); }
  static MOE_X86_INLINE A load_a_tail(const T* p, int rem) {
    return reinterpret_cast<A>(_mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << rem) - 1), p));
  }
  static MOE_X86_INLINE B load_b(const T* p) { return load_a(p); }
  static MOE_X86_INLINE B load_b_tail(const T* p, int rem) { return load_a_tail(p, rem); }
  static MOE_X86_INLINE void madd(Acc& acc, A a, B b) { acc = _mm512_dpbf16_ps(acc, a, b); }
  template <int NR>
  static MOE_X86_INLINE void store(const Acc (&acc)[NR], float* c, int nb, bool add) {
    x86::store_sums_avx512<NR>(acc, c, nb, add);
  }
};

// The bf16 bits of each e4m3 magnitude (sign cleared): exact, denormals
// included; the NaN pattern maps to a bf16 NaN.
struct E4m3Table {
  alignas(64) uint16_t bits[128];
  constexpr E4m3Table() : bits() {
    for (int v = 0; v < 128; ++v) {
      const int exponent = v >> 3, mantissa = v & 7;
      if (v == 0x7f) {
        bits[v] = 0x7fc0;
      } else if (exponent > 0) {
        bits[v] = static_cast<uint16_t>(((exponent + 120) << 7) | (mantissa << 4));
      } else if (mantissa > 0) {  // mantissa * 2^-9, normalized
        int shift = 0;
        while ((mantissa << shift) < 4) ++shift;
        bits[v] = static_cast<uint16_t>(((120 - shift) << 7) | (((mantissa << shift) & 3) << 5));
      }
    }
  }
};
constexpr E4m3Table kE4m3;

// 32 e4m3 bytes as bf16 by table lookup: two 64-entry permutes, picked by bit
// 6 of the byte; sign extension puts the sign bit where bf16 keeps it.
struct E4m3ToBF16 {
  __m512i t0, t1, t2, t3;
  E4m3ToBF16()
      : t0(_mm512_load_si512(kE4m3.bits)), t1(_mm512_load_si512(kE4m3.bits + 32)),
        t2(_mm512_load_si512(kE4m3.bits + 64)), t3(_mm512_load_si512(kE4m3.bits + 96)) {}
  MOE_X86_INLINE __m512bh operator()(__m256i bytes) const {
    const __m512i x = _mm512_cvtepi8_epi16(bytes);
    const __m512i low = _mm512_permutex2var_epi16(t0, x, t1);
    const __m512i high = _mm512_permutex2var_epi16(t2, x, t3);
    const __m512i magnitude = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(x, _mm512_set1_epi16(0x40)), low, high);
    // magnitude | (x & sign bit)
    return reinterpret_cast<__m512bh>(
        _mm512_ternarylogic_epi32(magnitude, x, _mm512_set1_epi16(static_cast<short>(0x8000)), 0xf8));
  }
};

// The fused fp8 GEMM's tiles: each block of K accumulates on its own and is
// added into the totals times its rows' scales (2 x MR x NR registers of
// fp32, so MR * NR <= 8).
struct Fp8Tiles {
  static constexpr int kNR1 = 8;

  const uint16_t* a;
  int64_t lda;
  const uint8_t* b;
  int64_t ldb;
  const Fp8Scales& sc;
  float* c;
  int64_t ldc;
  E4m3ToBF16 e4m3_to_bf16;

  int64_t row_bytes() const { return ldb; }

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const x86::TileCols& cols, int64_t /*p0*/, int64_t k, bool /*first*/) {
    const uint16_t* pa[MR];
    const uint8_t* pb[NR];
    const float* ps[NR];
    for (int r = 0; r < MR; ++r) pa[r] = a + (i + r) * lda;
    for (int q = 0; q < NR; ++q) {
      const int64_t j = cols.j + (q < cols.nb ? q : cols.nb - 1) * cols.stride;
      pb[q] = b + j * ldb;
      ps[q] = sc.scale + (sc.row0 + j) / sc.block_n * sc.ld;
    }
    const int64_t ahead = cols.ahead * ldb;
    __m512 total[MR][NR];
    for (int r = 0; r < MR; ++r) {
      for (int q = 0; q < NR; ++q) total[r][q] = _mm512_setzero_ps();
    }
    for (int64_t p0 = 0, block = 0; p0 < k; p0 += sc.block_k, ++block) {
      const int64_t p1 = k - p0 < sc.block_k ? k : p0 + sc.block_k;
      __m512 acc[MR][NR];
      for (int r = 0; r < MR; ++r) {
        for (int q = 0; q < NR; ++q) acc[r][q] = _mm512_setzero_ps();
      }
      for (int64_t p = p0; p < p1; p += 32) {
        const __mmask32 lanes = p1 - p >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1ull << (p1 - p)) - 1);
        __m512bh va[MR];
        for (int r = 0; r < MR; ++r) va[r] = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(lanes, pa[r] + p));
        for (int q = 0; q < NR; ++q) {
          if constexpr (MR == 1) __builtin_prefetch(pb[q] + ahead + p, 0, 3);
          const __m512bh vb = e4m3_to_bf16(_mm256_maskz_loadu_epi8(lanes, pb[q] + p));
          for (int r = 0; r < MR; ++r) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], va[r], vb);
        }
      }
      for (int q = 0; q < NR; ++q) {
        const __m512 s = _mm512_set1_ps(ps[q][block]);
        for (int r = 0; r < MR; ++r) total[r][q] = _mm512_fmadd_ps(acc[r][q], s, total[r][q]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      x86::store_cols<NR>(c + (i + r) * ldc + cols.j, cols, false,
                          [&](float* dst, bool) { x86::store_sums_avx512<NR>(total[r], dst, cols.nb, false); });
    }
  }
};

void gemm_bf16_fp8(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b, int64_t ldb,
                   const Fp8Scales& scales, float* c, int64_t ldc) {
  Fp8Tiles t{a, lda, b, ldb, scales, c, ldc, {}};
  if (m == 1) {
    x86::stream_rows(t, n, k, ldb);
    return;
  }
  int64_t i = 0;
  for (; i + 2 <= m; i += 2) {
    for (int64_t j = 0; j < n; j += 4) t.tile<2, 4>(i, {j, n - j < 4 ? static_cast<int>(n - j) : 4, 1, 4}, 0, k, true);
  }
  if (i < m) {
    for (int64_t j = 0; j < n; j += 8) t.tile<1, 8>(i, {j, n - j < 8 ? static_cast<int>(n - j) : 8, 1, 8}, 0, k, true);
  }
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc) {
  x86::gemm_float<DpBF16, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc);
}

void fp8_to_bf16(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k, uint16_t* dst) {
  x86::fp8_row_avx512(cols, src, scale, block_k, dst, [](uint16_t* d, __m512 v, __mmask16 lanes) {
    _mm256_mask_storeu_epi16(d, lanes, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  });
}

constexpr KernelSet kKernels{"avx512_bf16", avx512::gemm_f32, gemm_bf16, avx512::gemm_s8, fp8_to_bf16,
                             avx512::fp8_to_f32, gemm_bf16_fp8};

}  // namespace

const KernelSet& kernels_avx512_bf16() { return kKernels; }

}  // namespace moe_kernels
