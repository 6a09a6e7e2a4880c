// AVX-512 BF16: the avx512 level with its bf16 GEMM on vdpbf16ps, which
// multiplies pairs of adjacent K values - a dot product's own order, and its
// own fp8 widening (byte-table lookups into bf16, AVX-512 VBMI; scales in
// fp32). The rest is avx512's.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own
// -W(maybe-)uninitialized then reports once inlined (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "arch/x86/kernels_x86.h"
#include "core/kernels.h"
#include "core/row_kernels.h"

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

// The fused fp8 GEMM's tiles: each block of K accumulates on its own and is
// added into the totals times its rows' scales (2 x MR x NR registers of
// fp32, so MR * NR <= 8). Tiles are MR = 4 rows of a tall, so each widened
// vector of b meets every row; gemm_tiled runs them (kKBlock 0: the tiles
// walk all of K themselves). A step is 64 values of K, what one widening
// (x86::E4m3ToBF16) yields.
struct Fp8Tiles {
  static constexpr int kMR = 4;
  static constexpr int kNR = 2;
  static constexpr int kNR1 = 4;  // measured: as fast as 8 at m = 1, without register spills
  static constexpr int64_t kKBlock = 0;
  static constexpr int64_t kStep = 64;
  using T = uint8_t;

  const uint16_t* a;
  int64_t lda;
  const uint8_t* b;
  int64_t ldb;
  const Fp8Scales& sc;
  float* c;
  int64_t ldc;
  x86::E4m3ToBF16 e4m3_to_bf16;

  int64_t row_bytes() const { return ldb; }

  // acc += 64 values of K from p on (the first `lanes` of them).
  template <int MR, int NR, bool kTail>
  MOE_X86_INLINE void step(const uint16_t* const (&pa)[MR], const uint8_t* const (&pb)[NR], int64_t p,
                           int64_t ahead, __mmask64 lanes, __m512 (&acc)[MR][NR]) const {
    const __mmask32 first = static_cast<__mmask32>(lanes), second = static_cast<__mmask32>(lanes >> 32);
    // Few rows of a: each row's 64 values are put in the order in which
    // E4m3ToBF16::in_lanes widens b (K [0, 8), [16, 24), ... in the first
    // vector, the other 8s in the second), two lane shuffles a row that save
    // b's cross-lane interleaves, two per row of b. Dot products sum the
    // lanes in the end, so only a's and b's orders must agree.
    constexpr bool kInLanes = MR <= 2;
    __m512bh va[MR][2];
    for (int r = 0; r < MR; ++r) {
      const __m512i lo = kTail ? _mm512_maskz_loadu_epi16(first, pa[r] + p) : _mm512_loadu_si512(pa[r] + p);
      const __m512i hi =
          kTail ? _mm512_maskz_loadu_epi16(second, pa[r] + p + 32) : _mm512_loadu_si512(pa[r] + p + 32);
      va[r][0] = reinterpret_cast<__m512bh>(kInLanes ? _mm512_shuffle_i64x2(lo, hi, 0x88) : lo);
      va[r][1] = reinterpret_cast<__m512bh>(kInLanes ? _mm512_shuffle_i64x2(lo, hi, 0xdd) : hi);
    }
    for (int q = 0; q < NR; ++q) {
      // The weights stream from memory once: prefetch the rows that come
      // next, one 64-byte line a step, into L2 (measured ~5% faster than into
      // L1, whose 48 KiB the lines would crowd a whole tile early).
      __builtin_prefetch(pb[q] + ahead + p, 0, 2);
      const __m512i bytes = kTail ? _mm512_maskz_loadu_epi8(lanes, pb[q] + p) : _mm512_loadu_si512(pb[q] + p);
      const auto vb = kInLanes ? e4m3_to_bf16.in_lanes(bytes) : e4m3_to_bf16(bytes);
      for (int r = 0; r < MR; ++r) {
        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], va[r][0], vb.first);
        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], va[r][1], vb.second);
      }
    }
  }

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
      int64_t p = p0;
      for (; p + kStep <= p1; p += kStep) step<MR, NR, false>(pa, pb, p, ahead, 0, acc);
      if (p < p1) step<MR, NR, true>(pa, pb, p, ahead, ~__mmask64{0} >> (kStep - (p1 - p)), acc);
      for (int q = 0; q < NR; ++q) {
        const __m512 s = _mm512_set1_ps(ps[q][block]);
        for (int r = 0; r < MR; ++r) total[r][q] = _mm512_fmadd_ps(acc[r][q], s, total[r][q]);
      }
    }
    // store_sums_avx512 reduces 4 or 8 vectors: pad with zeros.
    constexpr int kSums = NR < 4 ? 4 : NR;
    for (int r = 0; r < MR; ++r) {
      __m512 sums[kSums];
      for (int q = 0; q < kSums; ++q) sums[q] = q < NR ? total[r][q] : _mm512_setzero_ps();
      x86::store_cols<NR>(c + (i + r) * ldc + cols.j, cols, false,
                          [&](float* dst, bool) { x86::store_sums_avx512<kSums>(sums, dst, cols.nb, false); });
    }
  }
};

void gemm_bf16_fp8(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b, int64_t ldb,
                   const Fp8Scales& scales, float* c, int64_t ldc) {
  Fp8Tiles t{a, lda, b, ldb, scales, c, ldc, {}};
  x86::gemm_tiled(t, m, n, k);
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc) {
  x86::gemm_float<DpBF16, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc);
}

// How far ahead of the row being widened to prefetch: the weights come from
// memory once, and a prefetch in flight keeps more of them coming than the
// hardware prefetcher alone (measured ~20% at K = 2048, one thread).
constexpr int64_t kWidenAhead = 1024;

// 32 values at a time (x86::fp8_scaled_bf16).
void fp8_to_bf16(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k, uint16_t* dst) {
  const x86::E4m3ToBF16 e4m3_to_bf16;
  for (int64_t c0 = 0; c0 < cols; c0 += block_k) {
    const int64_t c1 = cols - c0 < block_k ? cols : c0 + block_k;
    const __m512 s = _mm512_set1_ps(scale[c0 / block_k]);
    for (int64_t c = c0; c < c1; c += 32) {
      const __mmask32 lanes = c1 - c >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1ull << (c1 - c)) - 1);
      if (c % 64 == 0) __builtin_prefetch(src + c + kWidenAhead, 0, 3);
      _mm512_mask_storeu_epi16(dst + c, lanes, x86::fp8_scaled_bf16(e4m3_to_bf16, src + c, lanes, s));
    }
  }
}

constexpr KernelSet kKernels = row_kernels::compiled_here(
    {"avx512_bf16", avx512::gemm_f32, gemm_bf16, avx512::gemm_s8, fp8_to_bf16, avx512::fp8_to_f32, gemm_bf16_fp8});

}  // namespace

const KernelSet& kernels_avx512_bf16() { return kKernels; }

}  // namespace moe_kernels
