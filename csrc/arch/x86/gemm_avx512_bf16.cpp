// AVX-512 BF16: the avx512 level with its bf16 GEMMs on vdpbf16ps, which
// multiplies pairs of adjacent K values - a dot product's own order: bf16 rows,
// and the tile layout's bf16 and fp8 lines (int8 lines on vpdpbusd); the fused
// fp8 GEMM; the fused MXFP4 GEMM of few rows (gemm_mxfp4_avx512_bf16.cpp); and
// its own fp8 widening (byte-table lookups into bf16, AVX-512 VBMI; scales in
// fp32). The rest is avx512's. This is the top level of AMD's Zen 4 and 5
// (Intel's cores with these instructions have AMX): Zen 4 issues a vdpbf16ps
// zmm a cycle, 32 MACs against its FMAs' 16 (measured), where Intel's issue
// one every 2 cycles, half their FMAs' rate (amx's few rows take the FMAs).
#if defined(__GNUC__) && !defined(__clang__)
// GCC PR 105593, as in gemm_avx512.cpp.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "arch/x86/avx512_reduce.h"
#include "arch/x86/e4m3_bf16.h"
#include "arch/x86/kernels_x86.h"
#include "arch/x86/loop_nest.h"
#include "core/kernel_use.h"
#include "core/kernels.h"
#include "core/scratch.h"
#include "core/row_kernels.h"

namespace moe_xarch {
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
// added into the totals times its rows' scales (2 x MR x NR fp32 registers, so
// MR * NR <= 8). MR = 4 rows of a, so each widened vector of b meets every
// row. A step is 64 values of K, one widening (x86::E4m3ToBF16).
struct Fp8Tiles {
  static constexpr int kMR = 4;
  static constexpr int kNR = 2;
  static constexpr int kNR1 = 4;  // as fast as 8 at m = 1, without register spills
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

  using Acc = __m512;
  static MOE_X86_INLINE Acc zero() { return _mm512_setzero_ps(); }
  static MOE_X86_INLINE Acc add_scaled(Acc acc, float block_scale, Acc total) {
    return _mm512_fmadd_ps(acc, _mm512_set1_ps(block_scale), total);
  }

  // acc += 64 values of K from p on (the first rem of them).
  template <int MR, int NR, bool kTail>
  MOE_X86_INLINE void step(const uint16_t* const (&pa)[MR], const uint8_t* const (&pb)[NR], int64_t p,
                           int64_t ahead, int64_t rem, __m512 (&acc)[MR][NR]) const {
    const __mmask64 lanes = kTail ? ~__mmask64{0} >> (kStep - rem) : 0;
    const __mmask32 first = static_cast<__mmask32>(lanes), second = static_cast<__mmask32>(lanes >> 32);
    // Few rows of a: each row's 64 values are put in the order E4m3ToBF16::in_lanes
    // widens b in (K [0, 8), [16, 24), ... in the first vector): two lane shuffles
    // a row of a save two cross-lane interleaves a row of b, and dot products sum
    // their lanes in the end.
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
      // next, one 64-byte line a step, into L2 rather than L1, whose 48 KiB
      // the lines would crowd a whole tile early.
      __builtin_prefetch(pb[q] + ahead + p, 0, 2);
      const __m512i bytes = kTail ? _mm512_maskz_loadu_epi8(lanes, pb[q] + p) : _mm512_loadu_si512(pb[q] + p);
      const auto vb = kInLanes ? e4m3_to_bf16.in_lanes(bytes) : e4m3_to_bf16(bytes);
      for (int r = 0; r < MR; ++r) {
        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], va[r][0], vb.first);
        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], va[r][1], vb.second);
      }
    }
  }

  // store_sums_avx512 reduces 4 or 8 vectors: pad with zeros.
  template <int NR>
  MOE_X86_INLINE void store_row(const Acc (&total)[NR], float* dst, const x86::TileCols& cols) const {
    constexpr int kSums = NR < 4 ? 4 : NR;
    Acc sums[kSums];
    for (int q = 0; q < kSums; ++q) sums[q] = q < NR ? total[q] : zero();
    x86::store_cols<NR>(dst, cols, false,
                        [&](float* d, bool) { x86::store_sums_avx512<kSums>(sums, d, cols.nb, false); });
  }

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const x86::TileCols& cols, int64_t /*p0*/, int64_t k, bool /*first*/) {
    x86::fp8_scaled_tile<MR, NR>(*this, i, cols, k);
  }
};

void gemm_bf16_fp8(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b, int64_t ldb,
                   const Fp8Scales& scales, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Fp8);
  Fp8Tiles t{a, lda, b, ldb, scales, c, ldc, {}};
  x86::gemm_tiled(t, m, n, k);
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16);
  x86::gemm_float<DpBF16, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc);
}

// The weights come from memory once: a prefetch this far ahead keeps more of
// them coming than the hardware prefetcher alone.
constexpr int64_t kWidenAhead = 1024;

// 32 values at a time, by the lookup alone: bf16 holds every e4m3 value.
void fp8_to_bf16(int64_t cols, const uint8_t* src, uint16_t* dst) {
  MOE_KERNEL_USE(kFp8ToBF16);
  const x86::E4m3ToBF16 e4m3_to_bf16;
  for (int64_t c = 0; c < cols; c += 32) {
    const __mmask32 lanes = cols - c >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1ull << (cols - c)) - 1);
    if (c % 64 == 0) __builtin_prefetch(src + c + kWidenAhead, 0, 3);
    _mm512_mask_storeu_epi16(dst + c, lanes, reinterpret_cast<__m512i>(e4m3_to_bf16.first32(src + c, lanes)));
  }
}

// The tile layout (core/packed_layout.h): each 64-byte line of a 16-column block holds
// one 4-byte group of K of its 16 columns, so a block streams from memory as
// one run, and a line times a row's group of a, broadcast, adds into 16
// column sums in lanes - no horizontal sums, and no rows read 4 KiB apart.
constexpr int kBlockCols = 16;
constexpr int64_t kLineBytes = 64;

MOE_X86_INLINE int32_t load_group(const uint8_t* p) {
  int32_t group;
  __builtin_memcpy(&group, p, sizeof(group));
  return group;
}

// An Op of the line kernels: broadcast(p) a row's group of a, madd(acc, a, b)
// adds the group's products lane by lane, finish(...) turns a row's 16 sums
// into c.
struct LinesBF16 {
  using Acc = __m512;
  float* c;
  int64_t ldc;
  static MOE_X86_INLINE Acc zero() { return _mm512_setzero_ps(); }
  static MOE_X86_INLINE __m512i broadcast(const uint8_t* p) { return _mm512_set1_epi32(load_group(p)); }
  static MOE_X86_INLINE Acc madd(Acc acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
  static MOE_X86_INLINE Acc add(Acc x, Acc y) { return _mm512_add_ps(x, y); }
  MOE_X86_INLINE void finish(int64_t i, int64_t j, Acc acc) const { _mm512_storeu_ps(c + i * ldc + j, acc); }
};

// vpdpbusd multiplies unsigned by signed: a + 128 (each byte's sign bit
// flipped, in the broadcast vector: one vpxord with an embedded broadcast),
// and 128 times the columns' sums of b (from packing) taken away at the end;
// then both scales.
struct LinesU8S8 {
  // Not __m512i: GCC 12 then copies the accumulators of a tile of several
  // rows around every vpdpbusd, and spills some (as avx512's S8).
  using Acc = __v16si;
  const float* a_scale;
  const float* b_scale;
  const int32_t* b_sum;
  float* c;
  int64_t ldc;
  static MOE_X86_INLINE Acc zero() { return Acc{}; }
  static MOE_X86_INLINE __m512i broadcast(const uint8_t* p) {
    return _mm512_xor_si512(_mm512_broadcastd_epi32(_mm_loadu_si32(p)),
                            _mm512_set1_epi32(static_cast<int32_t>(0x80808080u)));
  }
  static MOE_X86_INLINE Acc madd(Acc acc, __m512i a, __m512i b) {
    return reinterpret_cast<Acc>(_mm512_dpbusd_epi32(reinterpret_cast<__m512i>(acc), a, b));
  }
  static MOE_X86_INLINE Acc add(Acc x, Acc y) { return x + y; }
  MOE_X86_INLINE void finish(int64_t i, int64_t j, Acc acc) const {
    const __m512i dot =
        _mm512_sub_epi32(reinterpret_cast<__m512i>(acc), _mm512_slli_epi32(_mm512_loadu_si512(b_sum + j), 7));
    const __m512 scale = _mm512_mul_ps(_mm512_loadu_ps(b_scale + j), _mm512_set1_ps(a_scale[i]));
    _mm512_storeu_ps(c + i * ldc + j, _mm512_mul_ps(_mm512_cvtepi32_ps(dot), scale));
  }
};

// Rows [i, i + MR) of a times NB blocks of b from column j, over all k_bytes
// of K. Few accumulators would wait on each other's latency: below four,
// each takes every kChains-th line into its own chain.
template <int MR, int NB, class Op>
MOE_X86_INLINE void line_tile(const Op& op, int64_t i, int64_t j, int64_t k_bytes, const uint8_t* a, int64_t lda,
                              const uint8_t* b) {
  constexpr int kChains = MR * NB >= 4 ? 1 : 4 / (MR * NB);
  typename Op::Acc acc[kChains][MR][NB];
  for (int h = 0; h < kChains; ++h) {
    for (int r = 0; r < MR; ++r) {
      for (int q = 0; q < NB; ++q) acc[h][r][q] = Op::zero();
    }
  }
  const uint8_t* rows[MR];
  for (int r = 0; r < MR; ++r) rows[r] = a + (i + r) * lda;
  const uint8_t* blocks[NB];
  for (int q = 0; q < NB; ++q) blocks[q] = b + (j + q * kBlockCols) * k_bytes;
  for (int64_t x0 = 0; x0 < k_bytes; x0 += kLineBytes) {  // k_bytes: a multiple of 64 (packing pads it)
    for (int g = 0; g < kLineBytes / 4; ++g) {
      const int64_t x = x0 + 4 * g;
      const int h = g % kChains;
      __m512i va[MR];
      for (int r = 0; r < MR; ++r) va[r] = Op::broadcast(rows[r] + x);
      for (int q = 0; q < NB; ++q) {
        const __m512i vb = _mm512_loadu_si512(blocks[q] + x * kBlockCols);
        for (int r = 0; r < MR; ++r) acc[h][r][q] = Op::madd(acc[h][r][q], va[r], vb);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int q = 0; q < NB; ++q) {
      for (int h = 1; h < kChains; ++h) acc[0][r][q] = Op::add(acc[0][r][q], acc[h][r][q]);
      op.finish(i + r, j + q * kBlockCols, acc[0][r][q]);
    }
  }
}

// rows (< MR) rows of a from row i: the tile of that height.
template <int MR, int NB, class Op>
MOE_X86_INLINE void line_tile_rows(int rows, const Op& op, int64_t i, int64_t j, int64_t k_bytes, const uint8_t* a,
                                   int64_t lda, const uint8_t* b) {
  if constexpr (MR > 1) {
    if (rows == MR - 1) {
      line_tile<MR - 1, NB>(op, i, j, k_bytes, a, lda, b);
    } else {
      line_tile_rows<MR - 1, NB>(rows, op, i, j, k_bytes, a, lda, b);
    }
  }
}

// NB blocks of columns from j against every row of a, MR rows at a time:
// the blocks stream from memory for the first rows and stay in L2 for the
// rest (NB * 16 * k_bytes: 256 KiB at NB = 4, K = 2048 bf16).
template <int MR, int NB, class Op>
void line_columns(const Op& op, int64_t m, int64_t j, int64_t k_bytes, const uint8_t* a, int64_t lda,
                  const uint8_t* b) {
  int64_t i = 0;
  for (; i + MR <= m; i += MR) line_tile<MR, NB>(op, i, j, k_bytes, a, lda, b);
  if (i < m) line_tile_rows<MR, NB>(static_cast<int>(m - i), op, i, j, k_bytes, a, lda, b);
}

// c (m x n, n a multiple of 16) = a times b in the tile layout: 64 columns at
// a time, then 32, then 16; register tiles of 16 accumulators.
template <class Op>
void line_gemm(const Op& op, int64_t m, int64_t n, int64_t k_bytes, const uint8_t* a, int64_t lda,
               const uint8_t* b) {
  int64_t j = 0;
  for (; j + 4 * kBlockCols <= n; j += 4 * kBlockCols) line_columns<4, 4>(op, m, j, k_bytes, a, lda, b);
  if (j + 2 * kBlockCols <= n) {
    line_columns<8, 2>(op, m, j, k_bytes, a, lda, b);
    j += 2 * kBlockCols;
  }
  if (j < n) line_columns<8, 1>(op, m, j, k_bytes, a, lda, b);
}

void gemm_bf16_tiles(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
                     int64_t, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Tiles);
  line_gemm(LinesBF16{c, ldc}, m, n, 2 * k, reinterpret_cast<const uint8_t*>(a), 2 * lda,
            reinterpret_cast<const uint8_t*>(b));
}

void gemm_s8_tiles(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                   const int8_t* b, int64_t, const float* b_scale, const int32_t* b_sum, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmS8Tiles);
  line_gemm(LinesU8S8{a_scale, b_scale, b_sum, c, ldc}, m, n, k, reinterpret_cast<const uint8_t*>(a), lda,
            reinterpret_cast<const uint8_t*>(b));
}

// fp8 in the line layout (fp8_line_byte): one 16-column block at a time, lanes
// are columns, so block scales apply lane by lane to each block of K's sums. A
// Lines source gives line q's two bf16 pairs of the 16 columns; these widen in
// registers (few rows of a: each line used once).
struct Fp8Lines {
  const x86::E4m3ToBF16& e4m3_to_bf16;
  const uint8_t* block;
  // Prefetched into L1: the hardware prefetcher alone, or into L2 only,
  // leaves decode waiting on the weights.
  static constexpr int64_t kAhead = 4096;
  MOE_X86_INLINE x86::E4m3ToBF16::Halves operator()(int64_t q) const {
    _mm_prefetch(reinterpret_cast<const char*>(block + kLineBytes * q + kAhead), _MM_HINT_T0);
    return e4m3_to_bf16.in_lanes(_mm512_loadu_si512(block + kLineBytes * q));
  }
};

// Rows [0, M) of a times one block (16 columns, whose scales are
// column_scales[q][block of K]) into c. Two lines a step feed four
// accumulators a row, independent chains; a block of K splits into lines
// (block_k % 4 == 0) and k may end inside one (the padding is zeros, as is a's).
template <int M, class Lines>
MOE_X86_INLINE void fp8_block_rows(const Lines& lines, int64_t k, int64_t block_k, const float* const* column_scales,
                                   const uint16_t* a, int64_t lda, float* c, int64_t ldc) {
  auto pair = [&](int r, int64_t p) { return reinterpret_cast<__m512bh>(_mm512_set1_epi32(load_group(
                                          reinterpret_cast<const uint8_t*>(a + r * lda + p)))); };
  __m512 total[M];
  for (int r = 0; r < M; ++r) total[r] = _mm512_setzero_ps();
  for (int64_t p0 = 0, blk = 0; p0 < k; p0 += block_k, ++blk) {
    const int64_t p1 = k - p0 < block_k ? k : p0 + block_k;
    alignas(64) float scale[kBlockCols];
    for (int q = 0; q < kBlockCols; ++q) scale[q] = column_scales[q][blk];
    __m512 acc[M][4];
    for (int r = 0; r < M; ++r) {
      for (int h = 0; h < 4; ++h) acc[r][h] = _mm512_setzero_ps();
    }
    for (int64_t p = p0; p < p1; p += 8) {
      const auto first = lines(p / 4);
      // The second line may lie past the block of K: zero weights then.
      const x86::E4m3ToBF16::Halves none{reinterpret_cast<__m512bh>(_mm512_setzero_si512()),
                                         reinterpret_cast<__m512bh>(_mm512_setzero_si512())};
      const auto second = p + 4 < p1 ? lines(p / 4 + 1) : none;
      for (int r = 0; r < M; ++r) {
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], pair(r, p), first.first);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], pair(r, p + 2), first.second);
        acc[r][2] = _mm512_dpbf16_ps(acc[r][2], pair(r, p + 4), second.first);
        acc[r][3] = _mm512_dpbf16_ps(acc[r][3], pair(r, p + 6), second.second);
      }
    }
    for (int r = 0; r < M; ++r) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
      total[r] = _mm512_fmadd_ps(sum, _mm512_load_ps(scale), total[r]);
    }
  }
  for (int r = 0; r < M; ++r) _mm512_storeu_ps(c + r * ldc, total[r]);
}

// Up to this many rows of a, fp8 is widened in registers (an instance per
// count), in either layout; more rows widen each block once.
constexpr int kFp8TileRows = 4;
bool gemm_bf16_fp8_takes(int64_t m) { return m <= kFp8TileRows; }

template <class Lines>
MOE_X86_INLINE void fp8_block(int rows, const Lines& lines, int64_t k, int64_t block_k,
                              const float* const* column_scales, const uint16_t* a, int64_t lda, float* c,
                              int64_t ldc) {
  switch (rows) {
    case 1: fp8_block_rows<1>(lines, k, block_k, column_scales, a, lda, c, ldc); break;
    case 2: fp8_block_rows<2>(lines, k, block_k, column_scales, a, lda, c, ldc); break;
    case 3: fp8_block_rows<3>(lines, k, block_k, column_scales, a, lda, c, ldc); break;
    default: fp8_block_rows<kFp8TileRows>(lines, k, block_k, column_scales, a, lda, c, ldc); break;
  }
}

// Blocks of K that do not split into lines: each block of 16 columns back to
// rows, for gemm_bf16_fp8.
void gemm_bf16_fp8_block_rows(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                              int64_t ldb, const Fp8Scales& sc, float* c, int64_t ldc) {
  uint8_t* rows = thread_scratch(ScratchUse::kFp8Block, kBlockCols * ldb);
  for (int64_t j = 0; j < n; j += kBlockCols) {
    for (int r = 0; r < kBlockCols; ++r) fp8_line_row(b + j * ldb, r, ldb, rows + r * ldb);
    Fp8Scales block_scales = sc;
    block_scales.row0 += j;
    gemm_bf16_fp8(m, kBlockCols, k, a, lda, rows, ldb, block_scales, c + j, ldc);
  }
}

// A block of K's sums times their columns' scales (one a column), into c:
// stored for the first block, added for the others.
struct LinesBF16Scaled : LinesBF16 {
  const float* scale;
  bool first;
  MOE_X86_INLINE void finish(int64_t i, int64_t j, Acc acc) const {
    float* dst = c + i * ldc + j;
    const __m512 s = _mm512_loadu_ps(scale + j);
    _mm512_storeu_ps(dst, first ? _mm512_mul_ps(acc, s) : _mm512_fmadd_ps(acc, s, _mm512_loadu_ps(dst)));
  }
};

// fp8 in the line layout: up to 4 rows of a widen each line in registers; more
// widen 4 blocks of columns once per block of K, exactly, and run them as the
// bf16 GEMM does, each block of K's sums taking their scales in fp32. A block
// of K not a whole number of 32-value panels goes back to rows.
void gemm_bf16_fp8_tiles(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                         int64_t ldb, const Fp8Scales& sc, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Fp8Tiles);
  const bool panels = m > kFp8TileRows;
  if (sc.block_k % (panels ? 32 : 4) != 0) {
    gemm_bf16_fp8_block_rows(m, n, k, a, lda, b, ldb, sc, c, ldc);
    return;
  }
  const x86::E4m3ToBF16 e4m3_to_bf16;
  auto scale_row = [&](int64_t j) { return sc.scale + (sc.row0 + j) / sc.block_n * sc.ld; };
  if (!panels) {
    for (int64_t j = 0; j < n; j += kBlockCols) {
      const float* column_scales[kBlockCols];
      for (int q = 0; q < kBlockCols; ++q) column_scales[q] = scale_row(j + q);
      fp8_block(static_cast<int>(m), Fp8Lines{e4m3_to_bf16, b + j * ldb}, k, sc.block_k, column_scales, a, lda,
                c + j, ldc);
    }
    return;
  }
  constexpr int64_t kGroupCols = 4 * kBlockCols;
  uint8_t* panel = thread_scratch(ScratchUse::kFp8Block, kGroupCols * 2 * sc.block_k);
  for (int64_t j = 0; j < n; j += kGroupCols) {
    const int64_t cols = n - j < kGroupCols ? n - j : kGroupCols;
    for (int64_t p0 = 0, blk = 0; p0 < k; p0 += sc.block_k, ++blk) {
      const int64_t len = k - p0 < sc.block_k ? k - p0 : sc.block_k;
      const int64_t panel_k = (len + 31) / 32 * 32;  // zeros past len (as is a)
      alignas(64) float scale[kGroupCols];
      for (int64_t q = 0; q < cols; ++q) scale[q] = scale_row(j + q)[blk];
      for (int64_t q = 0; q < cols; q += kBlockCols) {
        x86::widen_fp8_lines(e4m3_to_bf16, b + (j + q) * ldb + p0 * kBlockCols, len, panel + q * 2 * panel_k);
      }
      line_gemm(LinesBF16Scaled{{c + j, ldc}, scale, p0 == 0}, m, cols, 2 * panel_k,
                reinterpret_cast<const uint8_t*>(a + p0), 2 * lda, panel);
    }
  }
}

}  // namespace

const KernelSet& avx512_bf16::kernels() {
  static const KernelSet kernels = above(avx512::kernels(), [](KernelSet& set) {
    row_kernels::compiled_here(set);
    set.gemm_bf16 = gemm_bf16;
    set.fp8_to_bf16 = fp8_to_bf16;
    set.gemm_bf16_fp8 = gemm_bf16_fp8;
    set.gemm_bf16_fp8_takes = gemm_bf16_fp8_takes;
    set.tiles = PackLayout::kTiles16;
    set.gemm_bf16_tiles = gemm_bf16_tiles;
    set.gemm_s8_tiles = gemm_s8_tiles;
    set.gemm_bf16_fp8_tiles = gemm_bf16_fp8_tiles;
    set.gemm_bf16_mxfp4 = gemm_bf16_mxfp4;
    set.gemm_bf16_mxfp4_takes = gemm_bf16_mxfp4_takes;
  });
  return kernels;
}

}  // namespace moe_xarch
