// The x86_64 kernel levels, and the pieces of them that more than one level's
// file compiles.
//
// The gemm_<level>.cpp files are each compiled with their own ISA flags. The
// templates they share sit in an anonymous namespace on purpose: every
// including file gets a private copy built with its own flags, so the linker
// can never pick an AVX-512 copy for the AVX2 path. No C++ library headers.
#pragma once

#include "core/kernels.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define MOE_X86_INLINE inline __attribute__((always_inline))

namespace moe_xarch {

const KernelSet& kernels_avx2();
const KernelSet& kernels_avx512();
const KernelSet& kernels_avx512_bf16();
const KernelSet& kernels_amx();

// The avx512_bf16 level differs from avx512 in its bf16 GEMM and fp8 to bf16
// conversion only.
namespace avx512 {
void fp8_to_f32(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k, float* dst);
void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc);
void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
             const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c,
             int64_t ldc);
// gemm_int4_avx512.cpp: the 4-bit kernels of every AVX-512 level.
void gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
               const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc);
void mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst);
void mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst);
namespace {
// `set` with them: how each AVX-512 level takes them.
constexpr KernelSet with_four_bit(KernelSet set) {
  set.gemm_w4a8 = gemm_w4a8;
  set.mxfp4_to_bf16 = mxfp4_to_bf16;
  set.mxfp4_to_f32 = mxfp4_to_f32;
  return set;
}
}  // namespace
}  // namespace avx512

namespace x86 {
namespace {

// An Op is one level's view of one element type:
//   T, A, B, Acc        element, loaded a and b operands, accumulator vector
//   kStep               values of K per vector step
//   zero(), load_a(p), load_b(p), load_a_tail(p, rem), load_b_tail(p, rem)
//                       (the tails read only [0, rem) and act as zero-padded)
//   madd(acc, a, b)     acc += the K-wise products, in lanes
//   sum_b(acc, b)       acc += the K-wise sum of b (only the VNNI int8 op)
// Past rem, a tail load of b gives zeros; one of a may give any value (VNNI's
// bias turns its zeros into 128).

#if defined(__AVX2__)
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
#endif

// acc[r][c] (and bsum[c] when kSumB) for MR rows of a and NR rows of b,
// reduced over K lane-wise; the caller reduces the lanes.
template <class Op, int MR, int NR, bool kSumB, bool kTail>
MOE_X86_INLINE void dot_step(const typename Op::T* const (&a)[MR],
                             const typename Op::T* const (&b)[NR], int64_t p, int rem,
                             typename Op::Acc (&acc)[MR][NR], typename Op::Acc (&bsum)[NR]) {
  typename Op::A va[MR];
  for (int r = 0; r < MR; ++r) {
    if constexpr (kTail) {
      va[r] = Op::load_a_tail(a[r] + p, rem);
    } else {
      va[r] = Op::load_a(a[r] + p);
    }
  }
  for (int c = 0; c < NR; ++c) {
    typename Op::B vb;
    if constexpr (kTail) {
      vb = Op::load_b_tail(b[c] + p, rem);
    } else {
      vb = Op::load_b(b[c] + p);
    }
    if constexpr (kSumB) Op::sum_b(bsum[c], vb);
    for (int r = 0; r < MR; ++r) Op::madd(acc[r][c], va[r], vb);
  }
}

// The columns of a tile: c columns (and rows of b) j + q * stride for q < nb.
// `ahead`: rows of b from each of them to the one to prefetch (m = 1).
struct TileCols {
  int64_t j;
  int nb;
  int64_t stride;
  int64_t ahead;
};

// Row pointers of a tile; rows of b past the edge repeat the last one, so
// that tiles need no edge variants (their results are not stored).
// A one-row tile (m = 1) streams NR rows of b once: it prefetches the rows
// that come next, which the hardware prefetcher would only reach late.
template <class T, int MR, int NR>
struct TileRows {
  const T* a[MR];
  const T* b[NR];
  int64_t ahead;  // from a row of b to the one to prefetch
  TileRows(const T* a0, int64_t lda, const T* b0, int64_t ldb, const TileCols& cols)
      : ahead(cols.ahead * ldb) {
    for (int r = 0; r < MR; ++r) a[r] = a0 + r * lda;
    for (int c = 0; c < NR; ++c) b[c] = b0 + (c < cols.nb ? c : cols.nb - 1) * cols.stride * ldb;
  }
};

// store(dst, add) writes (or adds) a tile row's nb sums contiguously; spread
// them over columns `stride` apart.
template <int NR, class Store>
MOE_X86_INLINE void store_cols(float* c, const TileCols& cols, bool add, Store store) {
  if (cols.stride == 1) {
    store(c, add);
    return;
  }
  alignas(64) float sums[NR];
  store(sums, false);
  for (int q = 0; q < cols.nb; ++q) c[q * cols.stride] = add ? c[q * cols.stride] + sums[q] : sums[q];
}

template <class Op, int MR, int NR, bool kSumB>
MOE_X86_INLINE void dot_tile(int64_t k, const TileRows<typename Op::T, MR, NR>& rows,
                             typename Op::Acc (&acc)[MR][NR], typename Op::Acc (&bsum)[NR]) {
  for (int c = 0; c < NR; ++c) {
    bsum[c] = Op::zero();
    for (int r = 0; r < MR; ++r) acc[r][c] = Op::zero();
  }
  int64_t p = 0;
  for (; p + Op::kStep <= k; p += Op::kStep) {
    if constexpr (MR == 1) {
      for (int c = 0; c < NR; ++c) __builtin_prefetch(rows.b[c] + rows.ahead + p, 0, 3);
    }
    dot_step<Op, MR, NR, kSumB, false>(rows.a, rows.b, p, 0, acc, bsum);
  }
  if (p < k) dot_step<Op, MR, NR, kSumB, true>(rows.a, rows.b, p, static_cast<int>(k - p), acc, bsum);
}

// Loop nest for m > 1: a block of rows of a stays in L2 while NR-row slices
// of b, kept in L1, meet each of them. A tile reads MR + NR rows of one block
// of K before its rows of b come round again, so K is cut into blocks
// (Tiles::kKBlock values; 0: never) short enough for those to stay in L1.
constexpr int64_t kABlockBytes = 512 * 1024;
constexpr int64_t kTileL1Bytes = 32 * 1024;

template <class Tiles, int R>
MOE_X86_INLINE void tile_rows(Tiles& t, int rows, int64_t i, const TileCols& cols, int64_t p0,
                              int64_t kk, bool first) {
  if constexpr (R > 0) {
    if (rows == R) {
      t.template tile<R, Tiles::kNR>(i, cols, p0, kk, first);
    } else {
      tile_rows<Tiles, R - 1>(t, rows, i, cols, p0, kk, first);
    }
  }
}

// The hardware prefetcher follows one stream per 4 KiB page.
constexpr int64_t kPageBytes = 4096;

// m = 1: one pass over n rows of b, each row_bytes long, in 1 x NR1 tiles.
// Rows shorter than a page would put several of a tile's streams in one page;
// instead the rows of a tile are s apart, and the s tiles of a group carry
// on from one another, so each stream runs through whole pages.
template <class Tiles>
void stream_rows(Tiles& t, int64_t n, int64_t k, int64_t row_bytes) {
  constexpr int NR1 = Tiles::kNR1;
  const int64_t s = row_bytes >= kPageBytes ? 1 : (kPageBytes + row_bytes - 1) / row_bytes;
  int64_t j = 0;
  if (s > 1) {
    for (; j + NR1 * s <= n; j += NR1 * s) {
      for (int64_t q = 0; q < s; ++q) {
        t.template tile<1, NR1>(0, TileCols{j + q, NR1, s, q + 1 < s ? 1 : NR1 * s - q}, 0, k, true);
      }
    }
  }
  for (; j < n; j += NR1) {
    t.template tile<1, NR1>(0, TileCols{j, n - j < NR1 ? static_cast<int>(n - j) : NR1, 1, NR1}, 0, k, true);
  }
}

// The loop nest every GEMM of every level runs. Tiles provides kMR x kNR
// (m > 1) and 1 x kNR1 (m = 1) register tiles as
//   template <int MR, int NR> void tile(i, cols, p0, kk, first)
// computing c rows [i, i + MR) x the TileCols, nb <= NR, over K values
// [p0, p0 + kk): stored when p0 == 0, else added. `first` says that no
// earlier tile of this pass met these rows of b. Tiles::row_bytes() is the
// distance between rows of b.
template <class Tiles>
void gemm_tiled(Tiles& t, int64_t m, int64_t n, int64_t k) {
  constexpr int MR = Tiles::kMR;
  constexpr int NR = Tiles::kNR;
  if (m == 1) {
    stream_rows(t, n, k, t.row_bytes());
    return;
  }
  const int64_t kc = Tiles::kKBlock > 0 && Tiles::kKBlock < k ? Tiles::kKBlock : k;
  const int64_t row_bytes = kc * static_cast<int64_t>(sizeof(typename Tiles::T));
  int64_t mc = kABlockBytes / (row_bytes > 0 ? row_bytes : 1) / MR * MR;
  if (mc < MR) mc = MR;
  for (int64_t i0 = 0; i0 < m; i0 += mc) {
    const int64_t i1 = m - i0 < mc ? m : i0 + mc;
    int64_t p0 = 0;
    do {  // once even for k = 0, which stores zeros
      const int64_t kk = k - p0 < kc ? k - p0 : kc;
      for (int64_t j = 0; j < n; j += NR) {
        const TileCols cols{j, n - j < NR ? static_cast<int>(n - j) : NR, 1, NR};
        int64_t i = i0;
        for (; i + MR <= i1; i += MR) t.template tile<MR, NR>(i, cols, p0, kk, i == i0);
        if (i < i1) tile_rows<Tiles, MR - 1>(t, static_cast<int>(i1 - i), i, cols, p0, kk, i == i0);
      }
      p0 += kk;
    } while (p0 < k);
  }
}

// The fp32-result GEMMs (f32, bf16). Op::store<NR>(acc, c, nb, add) reduces
// NR accumulators and writes (or adds to c) the first nb sums.
template <class Op, int MR_, int NR_, int NR1_>
struct FloatTiles {
  static constexpr int kMR = MR_;
  static constexpr int kNR = NR_;
  static constexpr int kNR1 = NR1_;
  using T = typename Op::T;
  static constexpr int64_t kKBlock = kTileL1Bytes / ((MR_ + NR_) * sizeof(T)) / 64 * 64;

  const T* a;
  int64_t lda;
  const T* b;
  int64_t ldb;
  float* c;
  int64_t ldc;

  int64_t row_bytes() const { return ldb * static_cast<int64_t>(sizeof(T)); }

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const TileCols& cols, int64_t p0, int64_t kk, bool /*first*/) {
    const TileRows<T, MR, NR> rows(a + i * lda + p0, lda, b + cols.j * ldb + p0, ldb, cols);
    typename Op::Acc acc[MR][NR];
    typename Op::Acc unused[NR];
    dot_tile<Op, MR, NR, false>(kk, rows, acc, unused);
    for (int r = 0; r < MR; ++r) {
      store_cols<NR>(c + (i + r) * ldc + cols.j, cols, p0 > 0,
                     [&](float* dst, bool add) { Op::template store<NR>(acc[r], dst, cols.nb, add); });
    }
  }
};

template <class Op, int MR, int NR, int NR1>
void gemm_float(int64_t m, int64_t n, int64_t k, const typename Op::T* a, int64_t lda,
                const typename Op::T* b, int64_t ldb, float* c, int64_t ldc) {
  FloatTiles<Op, MR, NR, NR1> t{a, lda, b, ldb, c, ldc};
  gemm_tiled(t, m, n, k);
}

// The tile of the fused fp8 GEMMs (each level's Fp8Tiles::tile): each block
// of K accumulates on its own, Tiles::kStep values of K a t.step (the last
// one partial: its count of values), and is added into the totals times its
// row of b's block scale (Tiles::add_scaled); t.store_row writes a row's
// totals. The Tiles also give their vector type (Acc, zero()) and a, b, c.
template <int MR, int NR, class Tiles>
MOE_X86_INLINE void fp8_scaled_tile(const Tiles& t, int64_t i, const TileCols& cols, int64_t k) {
  using Acc = typename Tiles::Acc;
  const Fp8Scales& sc = t.sc;
  const uint16_t* pa[MR];
  const uint8_t* pb[NR];
  const float* ps[NR];
  for (int r = 0; r < MR; ++r) pa[r] = t.a + (i + r) * t.lda;
  for (int q = 0; q < NR; ++q) {
    const int64_t j = cols.j + (q < cols.nb ? q : cols.nb - 1) * cols.stride;
    pb[q] = t.b + j * t.ldb;
    ps[q] = sc.scale + (sc.row0 + j) / sc.block_n * sc.ld;
  }
  const int64_t ahead = cols.ahead * t.ldb;
  Acc total[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int q = 0; q < NR; ++q) total[r][q] = Tiles::zero();
  }
  for (int64_t p0 = 0, block = 0; p0 < k; p0 += sc.block_k, ++block) {
    const int64_t p1 = k - p0 < sc.block_k ? k : p0 + sc.block_k;
    Acc acc[MR][NR];
    for (int r = 0; r < MR; ++r) {
      for (int q = 0; q < NR; ++q) acc[r][q] = Tiles::zero();
    }
    int64_t p = p0;
    for (; p + Tiles::kStep <= p1; p += Tiles::kStep) t.template step<MR, NR, false>(pa, pb, p, ahead, 0, acc);
    if (p < p1) t.template step<MR, NR, true>(pa, pb, p, ahead, p1 - p, acc);
    for (int q = 0; q < NR; ++q) {
      for (int r = 0; r < MR; ++r) total[r][q] = Tiles::add_scaled(acc[r][q], ps[q][block], total[r][q]);
    }
  }
  for (int r = 0; r < MR; ++r) t.template store_row<NR>(total[r], t.c + (i + r) * t.ldc + cols.j, cols);
}

// INT4_W4A8's operands as the vector kernels read them (gemm_int4_avx512.cpp
// says why): rows of a in step order (per kStep values of K: the even ones,
// then the odd ones, zero-padded to whole steps), their sums per 32-value
// chunk, and per row of b and chunk, the group's scale and scale * zero
// point (zero past k); chunks a row padded to a multiple of 16.
constexpr int64_t kW4A8Chunk = 32;

template <int64_t kStep>
struct W4A8Operands {
  int64_t lda, chunks;
  int8_t* a;
  float* a_sums;
  float* scales;
  float* zero_scales;

  W4A8Operands(int64_t m, int64_t n, int64_t k, const int8_t* a_rows, int64_t a_ld, const Int4Groups& groups)
      : lda((k + kStep - 1) / kStep * kStep), chunks((lda / kW4A8Chunk + 15) / 16 * 16) {
    const int64_t a_bytes = m * lda, sums_bytes = m * chunks * 4, scale_bytes = n * chunks * 4;
    uint8_t* scratch = thread_scratch(ScratchUse::kInt4Groups, a_bytes + sums_bytes + 2 * scale_bytes);
    a = reinterpret_cast<int8_t*>(scratch);
    a_sums = reinterpret_cast<float*>(scratch + a_bytes);
    scales = reinterpret_cast<float*>(scratch + a_bytes + sums_bytes);
    zero_scales = reinterpret_cast<float*>(scratch + a_bytes + sums_bytes + scale_bytes);
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* row = a_rows + i * a_ld;
      int8_t* dst = a + i * lda;
      for (int64_t p = 0; p < lda; ++p) {
        const int64_t at = p % kStep;
        dst[p - at + at % 2 * (kStep / 2) + at / 2] = p < k ? row[p] : int8_t{0};
      }
      for (int64_t t = 0; t < chunks; ++t) {
        int32_t sum = 0;
        for (int64_t p = t * kW4A8Chunk; p < (t + 1) * kW4A8Chunk && p < k; ++p) sum += row[p];
        a_sums[i * chunks + t] = static_cast<float>(sum);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t t = 0; t < chunks; ++t) {
        const int64_t g = t * kW4A8Chunk / groups.group;
        const bool inside = t * kW4A8Chunk < k;
        const float scale = inside ? groups.scale[j * groups.ld + g] : 0.f;
        const int zero = groups.zero == nullptr ? 8 : inside ? groups.zero[j * groups.ld + g] : 0;
        scales[j * chunks + t] = scale;
        zero_scales[j * chunks + t] = scale * static_cast<float>(zero);
      }
    }
  }
};

// A W4A8 tile's NR rows of b and their chunk scales; past the edge the last repeats (as TileRows).
template <int NR>
struct W4A8Columns {
  const uint8_t* b[NR];
  const float* scale[NR];
  const float* zero_scale[NR];
  template <int64_t kStep>
  W4A8Columns(const W4A8Operands<kStep>& ops, const uint8_t* b0, int64_t ldb, const TileCols& cols) {
    for (int q = 0; q < NR; ++q) {
      const int64_t j = cols.j + (q < cols.nb ? q : cols.nb - 1) * cols.stride;
      b[q] = b0 + j * ldb;
      scale[q] = ops.scales + j * ops.chunks;
      zero_scale[q] = ops.zero_scales + j * ops.chunks;
    }
  }
};

#if defined(__AVX512F__)
// Shared by the avx512 and avx512_bf16 files.

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
#endif  // __AVX512F__

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
// Shared by the avx512_bf16 and amx files.

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
  // bf16 tile: each row's first pair of values in `first`, its second pair in
  // `second`. One in-lane shuffle into the line layout's order, then in_lanes.
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

// bf16 bits (16 of them, in 256 bits) as fp32.
MOE_X86_INLINE __m512 bf16_to_f32(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// 32 e4m3 bytes (the first `lanes`) as bf16 values times scale: widened
// exactly, multiplied in fp32, rounded to bf16 once.
MOE_X86_INLINE __m512i fp8_scaled_bf16(const E4m3ToBF16& e4m3_to_bf16, const uint8_t* src, __mmask32 lanes,
                                       __m512 scale) {
  const __m512i w = reinterpret_cast<__m512i>(e4m3_to_bf16.first32(src, lanes));
  const __m512 lo = _mm512_mul_ps(bf16_to_f32(_mm512_extracti64x4_epi64(w, 0)), scale);
  const __m512 hi = _mm512_mul_ps(bf16_to_f32(_mm512_extracti64x4_epi64(w, 1)), scale);
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}
// One 16-row block of fp8 b in the line layout (fp8_line_byte), every line
// that k reaches rounded up to 32 values (the layout's padding is zeros),
// widened into bf16 in the tile layout (kernels.h): line q into the 64-byte
// lines 2 q and 2 q + 1, the block's pairs of K in order - contiguous tiles
// for AMX, one stream for AVX-512. Each half (16 rows' bf16 pairs, lane r =
// row r) is stored as line(q, half) makes it, called for q in order.
template <class Line>
MOE_X86_INLINE void widen_fp8_lines(const E4m3ToBF16& e4m3_to_bf16, const uint8_t* block, int64_t k,
                                    uint8_t* panel, Line line) {
  constexpr int64_t kAhead = 1024;  // the next call's block, near the end: work items walk down the rows
  const int64_t lines = (k + 31) / 32 * 32 / 4;
  for (int64_t q = 0; q < lines; ++q) {
    _mm_prefetch(reinterpret_cast<const char*>(block + 64 * q + kAhead), _MM_HINT_T0);
    const auto pairs = e4m3_to_bf16.in_lanes(_mm512_loadu_si512(block + 64 * q));
    _mm512_store_si512(panel + 128 * q, line(q, pairs.first));
    _mm512_store_si512(panel + 128 * q + 64, line(q, pairs.second));
  }
}

// Widened exactly.
MOE_X86_INLINE void widen_fp8_lines(const E4m3ToBF16& e4m3_to_bf16, const uint8_t* block, int64_t k,
                                    uint8_t* panel) {
  widen_fp8_lines(e4m3_to_bf16, block, k, panel,
                  [](int64_t, __m512bh half) { return reinterpret_cast<__m512i>(half); });
}
#endif  // __AVX512BF16__ && __AVX512VBMI__

}  // namespace
}  // namespace x86
}  // namespace moe_xarch
