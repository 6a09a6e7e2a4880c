// The loop nest every x86 GEMM of every level runs, ISA-neutral: a level
// brings its vector operations (an Op) and its register tiles (a Tiles).
// Templates in an anonymous namespace on purpose: every including file gets
// a private copy built with its own ISA flags, so the linker can never pick
// one level's copy for another's path. No C++ library headers.
#pragma once

#include "arch/x86/inline.h"
#include "core/kernels.h"

namespace moe_xarch::x86 {
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

  // The column of the tile's q-th (past nb, the last again: see TileRows),
  // and that column alone.
  int64_t at(int q) const { return j + (q < nb ? q : nb - 1) * stride; }
  TileCols column(int q) const { return {at(q), 1, stride, ahead}; }
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
    // coverage: unreachable on x86_64 unless avx512 or avx512_bf16 or amx ran: the b sums of the VNNI int8 op
    //   (kSumB), whose tiles only the AVX-512 levels have: elsewhere the store is dead, and gcov counts no run of
    //   it
    bsum[c] = Op::zero();
    for (int r = 0; r < MR; ++r) acc[r][c] = Op::zero();
  }
  int64_t p = 0;
  for (; p + Op::kStep <= k; p += Op::kStep) {
    if constexpr (MR == 1) {
      // Into L2: into L1 was 0.59-0.95x on Zen 4 (bf16 and int8 decode at avx2 and avx512).
      for (int c = 0; c < NR; ++c) __builtin_prefetch(rows.b[c] + rows.ahead + p, 0, 2);
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

// Whether a Tiles' one-row tiles read their rows of b one after another
// (Tiles::kRowsInOrder), each over all of K, rather than side by side.
// Such tiles prefetch their one stream this many bytes ahead into L2: with
// the hardware prefetcher alone, or 1 or 2 KiB ahead, Zen 4 waited on memory.
constexpr int64_t kStreamAhead = 6 * 1024;

template <class Tiles>
constexpr bool rows_in_order() {
  if constexpr (requires { Tiles::kRowsInOrder; }) {
    return Tiles::kRowsInOrder;
  } else {
    return false;
  }
}

// m = 1: one pass over n rows of b, each row_bytes long, in 1 x NR1 tiles.
// Rows shorter than a page would put several of a tile's streams in one page;
// instead the rows of a tile are s apart, and the s tiles of a group carry
// on from one another, so each stream runs through whole pages. Tiles that
// read their rows in order take adjacent ones: one stream through all of b.
template <class Tiles>
void stream_rows(Tiles& t, int64_t n, int64_t k, int64_t row_bytes) {
  constexpr int NR1 = Tiles::kNR1;
  const int64_t s =
      rows_in_order<Tiles>() || row_bytes >= kPageBytes ? 1 : (kPageBytes + row_bytes - 1) / row_bytes;
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

// Tiles provides kMR x kNR (m > 1) and 1 x kNR1 (m = 1) register tiles as
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
    const int64_t j = cols.at(q);
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

}  // namespace
}  // namespace moe_xarch::x86
