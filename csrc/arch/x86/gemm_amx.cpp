// AMX: the avx512_bf16 level with its bf16, int8, fp8 and 4-bit GEMMs on tile
// multiplies (tdpbf16ps, tdpbssd: 16 x 16 outputs over 64 bytes of K) once
// there are rows of a enough to fill tiles; the rest is avx512_bf16's, but for
// few rows of bf16 and MXFP4, which take avx512's FMAs: Intel's cores, the
// only ones with AMX, run vdpbf16ps zmm at 16 MACs a cycle, half their FMAs'
// rate (measured on Emerald Rapids). A tile multiply wants b as 4-byte groups
// of K interleaved across 16 columns, so each 16-row block of b is transposed
// into a panel once per call, unless convert_weight_packed stored it so
// (gemm_*_tiles), or unless b is the first operand, as INT4's is, with a in
// the panels. A call handed to a lower level's kernel is counted there
// (core/kernel_use.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "arch/x86/e4m3_bf16.h"
#include "arch/x86/kernels_x86.h"
#include "arch/x86/mxfp4_avx512.h"
#include "arch/x86/w4a8_operands.h"
#include "core/kernel_use.h"
#include "core/kernels.h"
#include "core/scratch.h"

namespace moe_xarch {
namespace {

// Below this many rows of a, the transposes cost more than tiles save, and
// AVX-512 streams tile-layout weights faster than tiles.
constexpr int64_t kMinRows = 4;
constexpr int kTileRows = 16;
constexpr int64_t kTileBytes = 64;  // of K per tile row: 32 bf16 or 64 int8 values
// The first block of rows of a streams b from memory: its panels are fetched
// this many bytes of K ahead (the later blocks find them in cache).
constexpr int64_t kAhead = 2 * kTileBytes;

// Tiles: 0, 1 accumulate c (two 16-column blocks) for a block of rows of a
// held in 2; 3, 4 the panels; 5 a second block of rows of a, 6, 7 its sums.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  // k_bytes: of K per multiply (64, or 32: the panels' tiles are then their
  // first or last 8 rows).
  TileConfig(int first_rows, int second_rows, int k_bytes = kTileBytes) {
    for (int t = 0; t < 8; ++t) {
      const int count = t <= 2 ? first_rows : t <= 4 ? k_bytes / 4 : second_rows;
      rows[t] = static_cast<uint8_t>(count);
      colsb[t] = count ? (t == 2 || t == 5 ? k_bytes : 64) : 0;  // an unused tile has neither
    }
  }
};

MOE_X86_INLINE int block_rows(int64_t m, int64_t i) {
  return static_cast<int>(std::clamp<int64_t>(m - i, 0, kTileRows));
}

struct RowBlocks {
  int first, second;  // rows of a in tiles 2 and 5 (0: no second block)
};

// Starts the two blocks of rows of a from row i (of m): up to 16 rows each
// (the second may have none). The tiles are configured for their row counts
// (`configured` keeps what they have across calls) and their sums zeroed.
MOE_X86_INLINE RowBlocks begin_row_blocks(int64_t m, int64_t i, int& configured) {
  const RowBlocks rows{block_rows(m, i), block_rows(m, i + kTileRows)};
  const int key = rows.first * (kTileRows + 1) + rows.second + 1;
  if (key != configured) {
    const TileConfig config(rows.first, rows.second);
    _tile_loadconfig(&config);
    configured = key;
  }
  _tile_zero(0);
  _tile_zero(1);
  if (rows.second) {
    _tile_zero(6);
    _tile_zero(7);
  }
  return rows;
}

// The 16 x 16 matrix of 32-bit words in r, transposed.
MOE_X86_INLINE void transpose16x16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 16; i += 8) {
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// Rows [0, rows) of b (rows <= 16, the rest zero), k_bytes of each, as a
// panel in the tile layout (core/packed_layout.h): the tile of K bytes [p, p + 64) is
// the 1 KiB from panel + 16 p, its row g holding 4-byte group g of those
// bytes (2 bf16 or 4 int8 values of K) of each of the 16 rows of b.
void pack_panel(const uint8_t* b, int64_t ldb, int rows, int64_t k_bytes, uint8_t* panel) {
  for (int64_t p = 0; p < k_bytes; p += kTileBytes) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_si512(b + i * ldb + p) : _mm512_setzero_si512();
    transpose16x16(r);
    for (int i = 0; i < 16; ++i) _mm512_store_si512(panel + kTileRows * p + i * kTileBytes, r[i]);
  }
}

// The loop nest of both tile GEMMs, on bytes: two blocks of 16 rows of a
// (tiles 2, 5) meet 32 rows of b (panels in tiles 3, 4) over all of K, into
// tiles 0, 1 and 6, 7; each load of the panels serves both blocks, as 64 KiB
// of panels per 32 rows of b is more than L1 holds for a second pass.
// panels(j, nb) gives the two panels of rows [j, j + nb) of b, 16 * k_bytes
// each; each 16 x 32 block of results goes to finish(i, j, rows, nb, block).
template <class Panels, class Dot, class Finish>
void tile_loop(int64_t m, int64_t n, int64_t k_bytes, const uint8_t* a, int64_t lda, Panels panels, Dot dot,
               Finish finish) {
  alignas(64) int32_t block[kTileRows * 2 * kTileRows];
  int configured = 0;
  for (int64_t j = 0; j < n; j += 2 * kTileRows) {
    const int64_t nb = n - j < 2 * kTileRows ? n - j : 2 * kTileRows;
    const uint8_t* panel0;
    const uint8_t* panel1;
    panels(j, nb, &panel0, &panel1);
    for (int64_t i = 0; i < m; i += 2 * kTileRows) {
      const RowBlocks rows = begin_row_blocks(m, i, configured);
      const uint8_t* a0 = a + i * lda;
      const uint8_t* a1 = a0 + kTileRows * lda;
      for (int64_t p = 0; p < k_bytes; p += kTileBytes) {
        if (i == 0 && p + kAhead < k_bytes) {
          for (int g = 0; g < kTileRows; ++g) {
            const int64_t at = kTileRows * (p + kAhead) + g * kTileBytes;
            _mm_prefetch(reinterpret_cast<const char*>(panel0 + at), _MM_HINT_T0);
            if (nb > kTileRows) _mm_prefetch(reinterpret_cast<const char*>(panel1 + at), _MM_HINT_T0);
          }
        }
        _tile_loadd(2, a0 + p, lda);
        _tile_loadd(3, panel0 + kTileRows * p, kTileBytes);
        dot.first();
        if (nb > kTileRows) {
          _tile_loadd(4, panel1 + kTileRows * p, kTileBytes);
          dot.second();
        }
        if (rows.second) {
          _tile_loadd(5, a1 + p, lda);
          dot.third();
          if (nb > kTileRows) dot.fourth();
        }
      }
      _tile_stored(0, block, 2 * kTileRows * sizeof(int32_t));
      _tile_stored(1, block + kTileRows, 2 * kTileRows * sizeof(int32_t));
      finish(i, j, rows.first, static_cast<int>(nb), block);
      if (rows.second) {
        _tile_stored(6, block, 2 * kTileRows * sizeof(int32_t));
        _tile_stored(7, block + kTileRows, 2 * kTileRows * sizeof(int32_t));
        finish(i + kTileRows, j, rows.second, static_cast<int>(nb), block);
      }
    }
  }
  _tile_release();
}

// b as rows: each pair of 16-row blocks is put into panels once per call by
// pack(j, rows, panel), which writes rows [j, j + rows) of b (rows <= 16, the
// rest zero) as one panel of k_bytes of K.
template <class Pack, class Dot, class Finish>
void tile_gemm(int64_t m, int64_t n, int64_t k_bytes, const uint8_t* a, int64_t lda, Pack pack, Dot dot,
               Finish finish) {
  const int64_t panel_bytes = k_bytes * kTileRows;
  uint8_t* panel0 = thread_scratch(ScratchUse::kPanels, 2 * panel_bytes);
  uint8_t* panel1 = panel0 + panel_bytes;
  tile_loop(
      m, n, k_bytes, a, lda,
      [&](int64_t j, int64_t nb, const uint8_t** p0, const uint8_t** p1) {
        pack(j, static_cast<int>(nb < kTileRows ? nb : kTileRows), panel0);
        if (nb > kTileRows) pack(j + kTileRows, static_cast<int>(nb - kTileRows), panel1);
        *p0 = panel0;
        *p1 = panel1;
      },
      dot, finish);
}

// b already in the tile layout (core/packed_layout.h): its panels are read in place.
template <class Dot, class Finish>
void tile_gemm_packed(int64_t m, int64_t n, int64_t k_bytes, const uint8_t* a, int64_t lda, const uint8_t* b,
                      Dot dot, Finish finish) {
  tile_loop(
      m, n, k_bytes, a, lda,
      [&](int64_t j, int64_t, const uint8_t** p0, const uint8_t** p1) {
        *p0 = b + j * k_bytes;
        *p1 = *p0 + kTileRows * k_bytes;
      },
      dot, finish);
}

// The tile intrinsics take register numbers as literals: first and second
// are tile_loop's first block of rows against panels 0 and 1, third and
// fourth its second block.
struct DotBF16 {
  MOE_X86_INLINE void first() const { _tile_dpbf16ps(0, 2, 3); }
  MOE_X86_INLINE void second() const { _tile_dpbf16ps(1, 2, 4); }
  MOE_X86_INLINE void third() const { _tile_dpbf16ps(6, 5, 3); }
  MOE_X86_INLINE void fourth() const { _tile_dpbf16ps(7, 5, 4); }
};

struct DotS8 {
  MOE_X86_INLINE void first() const { _tile_dpbssd(0, 2, 3); }
  MOE_X86_INLINE void second() const { _tile_dpbssd(1, 2, 4); }
  MOE_X86_INLINE void third() const { _tile_dpbssd(6, 5, 3); }
  MOE_X86_INLINE void fourth() const { _tile_dpbssd(7, 5, 4); }
};

struct StoreF32 {
  float* c;
  int64_t ldc;
  MOE_X86_INLINE void operator()(int64_t i, int64_t j, int rows, int nb, const int32_t* block) const {
    for (int r = 0; r < rows; ++r) {
      std::memcpy(c + (i + r) * ldc + j, block + r * 2 * kTileRows, nb * sizeof(float));
    }
  }
};

// c gets the int32 dots of block times a_scale[row] * b_scale[column].
struct StoreScaledS32 {
  const float* a_scale;
  const float* b_scale;
  float* c;
  int64_t ldc;
  MOE_X86_INLINE void operator()(int64_t i, int64_t j, int rows, int nb, const int32_t* block) const {
    for (int half = 0; half * kTileRows < nb; ++half) {
      const int cols = nb - half * kTileRows < kTileRows ? nb - half * kTileRows : kTileRows;
      const __mmask16 lanes = static_cast<__mmask16>((1u << cols) - 1);
      const __m512 scale = _mm512_maskz_loadu_ps(lanes, b_scale + j + half * kTileRows);
      for (int r = 0; r < rows; ++r) {
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(block + r * 2 * kTileRows + half * kTileRows));
        _mm512_mask_storeu_ps(c + (i + r) * ldc + j + half * kTileRows, lanes,
                              _mm512_mul_ps(_mm512_mul_ps(dot, _mm512_set1_ps(a_scale[i + r])), scale));
      }
    }
  }
};

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc) {
  if (m < kMinRows || k % (kTileBytes / 2) != 0) {
    avx512::kernels().gemm_bf16(m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  MOE_KERNEL_USE(kGemmBF16);
  const auto* rows = reinterpret_cast<const uint8_t*>(b);
  tile_gemm(
      m, n, 2 * k, reinterpret_cast<const uint8_t*>(a), 2 * lda,
      [&](int64_t j, int nb, uint8_t* panel) { pack_panel(rows + 2 * j * ldb, 2 * ldb, nb, 2 * k, panel); },
      DotBF16{}, StoreF32{c, ldc});
}

// Signed times signed (tdpbssd): no bias, so b_sum is not needed.
void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
             const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c, int64_t ldc) {
  if (m < kMinRows || k % kTileBytes != 0) {
    avx512_bf16::kernels().gemm_s8(m, n, k, a, lda, a_scale, b, ldb, b_scale, b_sum, c, ldc);
    return;
  }
  MOE_KERNEL_USE(kGemmS8);
  const auto* rows = reinterpret_cast<const uint8_t*>(b);
  tile_gemm(
      m, n, k, reinterpret_cast<const uint8_t*>(a), lda,
      [&](int64_t j, int nb, uint8_t* panel) { pack_panel(rows + j * ldb, ldb, nb, k, panel); }, DotS8{},
      StoreScaledS32{a_scale, b_scale, c, ldc});
}

// The fp8 rows of b stream from memory once: each row prefetches this many
// bytes ahead, into the next 16 rows near its end (the next call's, usually:
// work items walk down the rows).
constexpr int64_t kFp8Ahead = 1024;
constexpr int64_t kTileValues = kTileBytes / 2;  // bf16 values of K per tile row
constexpr int64_t kTileSize = kTileRows * kTileBytes;

// Rows [j, j + rows) of fp8 b (rows <= 16, the rest zero), k values of each
// (a multiple of 32), widened exactly (x86::E4m3ToBF16) straight into a panel
// of contiguous tiles, whose rows do not share L1 sets as rows 2 k bytes apart
// would: the tile of values [p, p + 32) is the 1 KiB from panel + 32 p, its row
// g the bf16 pair g of each row of b. The transpose runs on the fp8 bytes
// before widening (E4m3ToBF16::groups): half the shuffles of bf16 pairs.
void widen_panel(const uint8_t* b, int64_t ldb, int64_t j, int rows, int64_t k, uint8_t* panel) {
  const x86::E4m3ToBF16 e4m3_to_bf16;
  const uint8_t* src[kTileRows];
  for (int i = 0; i < kTileRows; ++i) src[i] = b + (j + (i < rows ? i : rows - 1)) * ldb;
  for (int64_t p = 0; p < k; p += kTileBytes) {
    const int64_t ahead = p + kFp8Ahead < k ? kFp8Ahead : kFp8Ahead - k + kTileRows * ldb;
    const __mmask64 lanes = k - p >= kTileBytes ? ~__mmask64{0} : (__mmask64{1} << (k - p)) - 1;
    __m512i r[16];
    for (int i = 0; i < kTileRows; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(src[i] + p + ahead), _MM_HINT_T0);
      r[i] = i < rows ? _mm512_maskz_loadu_epi8(lanes, src[i] + p) : _mm512_setzero_si512();
    }
    transpose16x16(r);  // r[g]: values [p + 4 g, + 4) of each row
    for (int g = 0; 4 * g < k - p && g < kTileRows; ++g) {
      const auto pairs = e4m3_to_bf16.groups(r[g]);
      const int64_t pair = p / 2 + 2 * g;  // the first pair of K values of r[g]
      uint8_t* row = panel + pair / kTileRows * kTileSize + pair % kTileRows * kTileBytes;
      _mm512_store_si512(row, reinterpret_cast<__m512i>(pairs.first));
      _mm512_store_si512(row + kTileBytes, reinterpret_cast<__m512i>(pairs.second));
    }
  }
}

// Rows of a, 16 at a time, for tile loads that take 16 whenever m > 16, so the
// tiles keep one configuration (a last block of fewer rows would reload it
// twice per block of K): that block is copied once per call into scratch, zero
// rows after m (their sums are never stored). row_bytes: what a tile load
// reads of a row; lda: bytes from row to row.
class RowsOfA {
 public:
  RowsOfA(const uint8_t* a, int64_t lda, int64_t m, int64_t row_bytes)
      : a_(a), lda_(lda), whole_(m <= kTileRows ? m : m / kTileRows * kTileRows) {
    if (whole_ == m) return;
    tail_ = thread_scratch(ScratchUse::kRowsOfA, kTileRows * lda);
    for (int64_t r = 0; r < kTileRows; ++r) {
      if (whole_ + r < m) {
        std::memcpy(tail_ + r * lda, a + (whole_ + r) * lda, row_bytes);
      } else {
        std::memset(tail_ + r * lda, 0, row_bytes);
      }
    }
  }

  int tile_rows() const { return whole_ < kTileRows ? static_cast<int>(whole_) : kTileRows; }

  // Rows [i, i + 16), i a multiple of 16 below m.
  const uint8_t* block(int64_t i) const { return i < whole_ ? a_ + i * lda_ : tail_; }

 private:
  const uint8_t* a_;
  int64_t lda_;
  int64_t whole_;  // rows read in place
  uint8_t* tail_ = nullptr;
};

// The bf16 tile GEMM whose K runs in blocks of block_bytes, each with its own
// scale per column of b (fp8's block scales): each 32 columns of b are widened
// into two panels once per call by widen(j, rows, panel) (rows [j, j + rows) of
// b, rows <= 16, the rest zero, every tile k_bytes reaches), then every 16 rows
// of a meet them in tiles 0, 1 a block of K at a time, each block's sums added
// into fp32 totals (c) times col_scale(column, block). The scales never touch
// the widened values. All of K is widened before the tiles, keeping the loads
// of b back to back, where a block at a time into L1 stalls on each. Blocks of
// K are whole tile rows, or halves.
template <class ColScale, class Widen>
void blocked_tile_gemm(int64_t m, int64_t n, int64_t k_bytes, const uint8_t* a, int64_t lda, int64_t block_bytes,
                       ColScale col_scale, float* c, int64_t ldc, Widen widen) {
  constexpr int kCols = 2 * kTileRows;
  const int64_t blocks = (k_bytes + block_bytes - 1) / block_bytes;
  const int64_t panel_bytes = (k_bytes + kTileBytes - 1) / kTileBytes * kTileSize;
  uint8_t* panel0 =
      thread_scratch(ScratchUse::kPanels, 2 * panel_bytes + (blocks + m) * kCols * static_cast<int64_t>(sizeof(float)));
  uint8_t* panel1 = panel0 + panel_bytes;
  float* col_scales = reinterpret_cast<float*>(panel1 + panel_bytes);  // [blocks][kCols]
  float* total = col_scales + blocks * kCols;                          // [m][kCols]
  alignas(64) float dots[kTileRows][kCols];
  // A row of a meets a panel row of tiles: kTileBytes per tile of K.
  const RowsOfA rows_of_a(a, lda, m, panel_bytes / kTileRows);
  const int step = block_bytes % kTileBytes == 0 ? kTileBytes : kTileBytes / 2;
  const TileConfig config(rows_of_a.tile_rows(), 0, step);
  _tile_loadconfig(&config);
  const DotBF16 dot;
  for (int64_t j = 0; j < n; j += kCols) {
    const int nb = static_cast<int>(n - j < kCols ? n - j : kCols);
    for (int q = 0; q < kCols; ++q) {
      const int64_t column = j + (q < nb ? q : nb - 1);
      for (int64_t blk = 0; blk < blocks; ++blk) col_scales[blk * kCols + q] = col_scale(column, blk);
    }
    for (int64_t i = 0; i < m * kCols; i += kTileRows) _mm512_store_ps(total + i, _mm512_setzero_ps());
    widen(j, nb < kTileRows ? nb : kTileRows, panel0);
    if (nb > kTileRows) widen(j + kTileRows, nb - kTileRows, panel1);
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t p0 = blk * block_bytes, p1 = k_bytes - p0 < block_bytes ? k_bytes : p0 + block_bytes;
      for (int64_t i = 0; i < m; i += kTileRows) {
        const int rows = block_rows(m, i);
        const uint8_t* a_rows = rows_of_a.block(i);
        _tile_zero(0);
        _tile_zero(1);
        for (int64_t p = p0; p < p1; p += step) {
          _tile_loadd(2, a_rows + p, lda);
          _tile_loadd(3, panel0 + kTileRows * p, kTileBytes);
          dot.first();
          if (nb > kTileRows) {
            _tile_loadd(4, panel1 + kTileRows * p, kTileBytes);
            dot.second();
          }
        }
        _tile_stored(0, &dots[0][0], kCols * sizeof(int32_t));
        _tile_stored(1, &dots[0][kTileRows], kCols * sizeof(int32_t));
        for (int h = 0; h < kCols; h += kTileRows) {
          const __m512 s = _mm512_load_ps(col_scales + blk * kCols + h);
          for (int r = 0; r < rows; ++r) {
            float* t = total + (i + r) * kCols + h;
            _mm512_store_ps(t, _mm512_fmadd_ps(_mm512_load_ps(&dots[r][h]), s, _mm512_load_ps(t)));
          }
        }
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int h = 0; h < nb; h += kTileRows) {
        const __mmask16 lanes = nb - h >= kTileRows ? 0xffff : static_cast<__mmask16>((1u << (nb - h)) - 1);
        _mm512_mask_storeu_ps(c + i * ldc + j + h, lanes, _mm512_load_ps(total + i * kCols + h));
      }
    }
  }
  _tile_release();
}

template <class Widen>
void fp8_tile_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const Fp8Scales& scales,
                   float* c, int64_t ldc, Widen widen) {
  blocked_tile_gemm(
      m, n, 2 * k, reinterpret_cast<const uint8_t*>(a), 2 * lda, 2 * scales.block_k,
      [&](int64_t column, int64_t blk) {
        return scales.scale[(scales.row0 + column) / scales.block_n * scales.ld + blk];
      },
      c, ldc, widen);
}

void gemm_bf16_fp8(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b, int64_t ldb,
                   const Fp8Scales& scales, float* c, int64_t ldc) {
  if (m < kMinRows || k % kTileValues != 0 || scales.block_k % kTileValues != 0) {
    avx512_bf16::kernels().gemm_bf16_fp8(m, n, k, a, lda, b, ldb, scales, c, ldc);
    return;
  }
  MOE_KERNEL_USE(kGemmBF16Fp8);
  fp8_tile_gemm(m, n, k, a, lda, scales, c, ldc,
                [&](int64_t j, int rows, uint8_t* panel) { widen_panel(b, ldb, j, rows, k, panel); });
}

void gemm_bf16_fp8_tiles(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                         int64_t ldb, const Fp8Scales& scales, float* c, int64_t ldc) {
  if (m < kMinRows || scales.block_k % kTileValues != 0) {
    avx512_bf16::kernels().gemm_bf16_fp8_tiles(m, n, k, a, lda, b, ldb, scales, c, ldc);
    return;
  }
  MOE_KERNEL_USE(kGemmBF16Fp8Tiles);
  const x86::E4m3ToBF16 e4m3_to_bf16;
  fp8_tile_gemm(m, n, k, a, lda, scales, c, ldc, [&](int64_t j, int, uint8_t* panel) {
    x86::widen_fp8_lines(e4m3_to_bf16, b + j * ldb, k, panel);
  });
}

// Each row of 4-bit b prefetches this many bytes ahead, as the fp8 rows do.
constexpr int64_t kFourBitAhead = 512;

// The bytes of row `row` of 4-bit b ahead of byte x: into the next 16 rows near its end.
MOE_X86_INLINE const char* four_bit_ahead(const uint8_t* b, int64_t ldb, int64_t row, int64_t x, int64_t row_bytes) {
  const int64_t ahead = x + kFourBitAhead < row_bytes ? kFourBitAhead : kFourBitAhead - row_bytes + kTileRows * ldb;
  return reinterpret_cast<const char*>(b + row * ldb + x + ahead);
}

// INT4_W4A8 with the weights as the tiles' first operand: the transposed
// product c^T = b a^T, so each row of b widens into a tile row as it lies,
// with no transpose, and only the few rows of a go into panels, once for all
// the calls on the same rows (thread_prepared_rows).
// Each group's int32 sums are stored and added, times its scale, into fp32
// totals held in registers over a slice of K. Slices of 16 rows of b widen
// one ahead, a share after each group's multiplies are issued, so that the
// widening runs while the tiles multiply.

// Below this many rows of a, avx512's INT4 panels beat the tiles (whose
// groups each take a tile store and reload).
constexpr int64_t kW4A8TileRows = 5;

// Groups of K in flight, one tile of sums each: tile multiplies run in
// order, so a group's sums are stored only after the next group's multiplies
// are issued.
constexpr int kGroupsInFlight = 2;
// Values of K widened at a time: that slice of 16 rows of b, and of the
// panels of a, stays in L1 for every block of rows of a.
constexpr int64_t kSliceValues = 512;

// Tiles 0 and 1: the sums of the groups in flight; 2: 16 rows of b, 3: the
// panel of a block of rows of a, `step` bytes of K.
TileConfig w4a8_config(int step) {
  TileConfig config(0, 0);
  for (int t = 0; t < 4; ++t) {
    config.rows[t] = static_cast<uint8_t>(t == 3 ? step / 4 : kTileRows);
    config.colsb[t] = static_cast<uint16_t>(t == 2 ? step : kTileBytes);
  }
  return config;
}

// The tile intrinsics take register numbers as literals: w4a8_config's sums
// of group t in flight, by number.
MOE_X86_INLINE void w4a8_dot(int t) {
  if (t == 0) {
    _tile_dpbssd(0, 2, 3);
  } else {
    _tile_dpbssd(1, 2, 3);
  }
}

MOE_X86_INLINE void w4a8_zero(int t) {
  if (t == 0) {
    _tile_zero(0);
  } else {
    _tile_zero(1);
  }
}

MOE_X86_INLINE void w4a8_store(int t, int32_t* dst) {
  if (t == 0) {
    _tile_stored(0, dst, kTileBytes);
  } else {
    _tile_stored(1, dst, kTileBytes);
  }
}

// A 16 x 16 block of c^T (fp32, `ld` values from row to row; row r is row r
// of b, lane q row q of a) into c: its first rows_b rows of b for rows_a rows
// of a, row q times scale[q] (null: as they are).
MOE_X86_INLINE void store_transposed(const void* block, int64_t ld, int rows_b, int rows_a, const float* scale,
                                     float* c, int64_t ldc) {
  const auto* values = static_cast<const float*>(block);
  __m512i by_row[kTileRows];
  for (int r = 0; r < kTileRows; ++r) by_row[r] = _mm512_loadu_si512(values + r * ld);
  transpose16x16(by_row);  // by_row[q]: row q of a against the 16 rows of b
  const __mmask16 lanes = static_cast<__mmask16>((1u << rows_b) - 1);
  for (int q = 0; q < rows_a; ++q) {
    const __m512 row = _mm512_castsi512_ps(by_row[q]);
    _mm512_mask_storeu_ps(c + q * ldc, lanes, scale ? _mm512_mul_ps(row, _mm512_set1_ps(scale[q])) : row);
  }
}

// Values [lo, hi) (multiples of 64, or hi = k) of row `row` of 4-bit b, each
// less its group's zero point (in [-15, 15]), into dst (zeros past k to the
// tile row's end).
void widen_w4a8_row(const uint8_t* b, int64_t ldb, const Int4Groups& groups, int64_t row, int64_t lo, int64_t hi,
                    int64_t k, int8_t* dst) {
  const uint8_t* src = b + row * ldb;
  const uint8_t* zero = groups.zero ? groups.zero + row * groups.ld : nullptr;
  int64_t g = lo / groups.group, g_end = (g + 1) * groups.group;  // value p's group, and where it ends
  for (int64_t p = lo; p < hi; p += kTileBytes) {
    while (p >= g_end) ++g, g_end += groups.group;
    _mm_prefetch(four_bit_ahead(b, ldb, row, p / 2, k / 2), _MM_HINT_T0);
    const bool whole = k - p >= kTileBytes;  // 64 values, or the last 32
    // Byte x holds values 2 x (low nibble) and 2 x + 1: word x gets them as its two bytes.
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(whole ? ~__mmask32{0} : 0xffff, src + p / 2));
    const __m512i q = _mm512_ternarylogic_epi32(w, _mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x0f0f), 0xa8);  // (w | w << 4) & 0x0f0f
    // Values [p, p + 32) and [p + 32, p + 64) may be two groups.
    const char z0 = static_cast<char>(zero ? zero[g] : x86::kW4A8DefaultZero);
    const char z1 = static_cast<char>(zero && whole ? zero[p + 32 < g_end ? g : g + 1] : z0);
    const __m512i zeros = _mm512_inserti64x4(_mm512_set1_epi8(z0), _mm256_set1_epi8(z1), 1);
    _mm512_store_si512(dst + (p - lo), _mm512_maskz_sub_epi8(whole ? ~__mmask64{0} : 0xffffffffu, q, zeros));
  }
}

void gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale, const uint8_t* b,
               int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  if (m < kW4A8TileRows) {
    avx512::gemm_w4a8(m, n, k, a, lda, a_scale, b, ldb, groups, c, ldc);
    return;
  }
  MOE_KERNEL_USE(kGemmW4A8);
  const int64_t k_bytes = (k + kTileBytes - 1) / kTileBytes * kTileBytes;
  const int64_t count = (k + groups.group - 1) / groups.group;
  const int64_t a_blocks = (m + kTileRows - 1) / kTileRows;
  // Slices end on group ends that are multiples of 64 values (a widening step), or at k.
  const int64_t slice_groups = std::max<int64_t>(kSliceValues / groups.group / 2 * 2, 2);
  const int64_t slice_bytes = std::min(k_bytes, slice_groups * groups.group);
  const int64_t block_slices = (count + slice_groups - 1) / slice_groups;
  const int64_t slices = (n + kTileRows - 1) / kTileRows * block_slices;
  // Each block of 16 rows of a as a panel; two slices of 16 widened rows of b,
  // with their group scales [group of the slice][16]; the fp32 totals of each
  // block of rows of a, [block][row of b][row of a].
  const int64_t panel_bytes = kTileRows * k_bytes, total_bytes = kTileRows * kTileRows * sizeof(float);
  const int64_t slice_scales = slice_groups * kTileRows;
  const PreparedRows prepared = thread_prepared_rows(
      ScratchUse::kPanels,
      a_blocks * (panel_bytes + total_bytes) + 2 * kTileRows * slice_bytes +
          2 * slice_scales * static_cast<int64_t>(sizeof(float)),
      a, m, k);
  uint8_t* panels = prepared.data;
  auto* w = reinterpret_cast<int8_t*>(panels + a_blocks * panel_bytes);
  auto* totals = reinterpret_cast<float*>(w + 2 * kTileRows * slice_bytes);
  float* b_scale = totals + a_blocks * kTileRows * kTileRows;
  for (int64_t ib = 0; ib < a_blocks && !prepared.ready; ++ib) {
    // The driver's rows of a are zero past k to a multiple of 64 values (core/activations.h).
    pack_panel(reinterpret_cast<const uint8_t*>(a + ib * kTileRows * lda), lda, block_rows(m, ib * kTileRows),
               k_bytes, panels + ib * panel_bytes);
  }
  // Slice t: each block of rows of b's slices, block by block; its rows of
  // b from j, its groups [s0, s1), widened into buffer t % 2.
  struct Slice {
    int64_t j, s0, s1;
    int8_t* w;
    float* scale;
  };
  const auto slice = [&](int64_t t) {
    const int64_t s0 = t % block_slices * slice_groups;
    return Slice{t / block_slices * kTileRows, s0, std::min(count, s0 + slice_groups),
                 w + t % 2 * kTileRows * slice_bytes, b_scale + t % 2 * slice_scales};
  };
  // Slice t's rows [r0, r1) widened.
  const auto widen = [&](int64_t t, int r0, int r1) {
    const Slice sl = slice(t);
    const int nb = block_rows(n, sl.j);
    for (int r = r0; r < r1; ++r) {
      const int64_t row = sl.j + (r < nb ? r : nb - 1);
      widen_w4a8_row(b, ldb, groups, row, sl.s0 * groups.group, std::min(k, sl.s1 * groups.group), k,
                     sl.w + r * slice_bytes);
      for (int64_t g = sl.s0; g < sl.s1; ++g) sl.scale[(g - sl.s0) * kTileRows + r] = groups.scale[row * groups.ld + g];
    }
  };
  const int step = groups.group % kTileBytes == 0 ? kTileBytes : kTileBytes / 2;
  const TileConfig config = w4a8_config(step);
  _tile_loadconfig(&config);
  alignas(64) int32_t dots[kGroupsInFlight][kTileRows][kTileRows];
  widen(0, 0, kTileRows);
  for (int64_t t = 0; t < slices; ++t) {
    const auto [j, s0, s1, wb, slice_scale] = slice(t);
    if (s0 == 0) {
      for (int64_t i = 0; i < a_blocks * kTileRows * kTileRows; i += kTileRows) {
        _mm512_store_ps(totals + i, _mm512_setzero_ps());
      }
    }
    // The next slice widens a share of its rows after each step of groups of
    // the first block of rows of a.
    const int64_t shares = (s1 - s0 + kGroupsInFlight - 1) / kGroupsInFlight;
    for (int64_t ib = 0; ib < a_blocks; ++ib) {
      const uint8_t* panel = panels + ib * panel_bytes;
      float* total = totals + ib * kTileRows * kTileRows;
      // The block's fp32 totals stay in registers over the slice.
      __m512 sums[kTileRows];
      for (int r = 0; r < kTileRows; ++r) sums[r] = _mm512_load_ps(total + r * kTileRows);
      for (int64_t g0 = s0; g0 < s1; g0 += kGroupsInFlight) {
        const int in_flight = static_cast<int>(std::min<int64_t>(kGroupsInFlight, s1 - g0));
        for (int u = 0; u < in_flight; ++u) {
          const int64_t p0 = (g0 + u) * groups.group, p1 = std::min(k, p0 + groups.group);
          w4a8_zero(u);
          for (int64_t p = p0; p < p1; p += step) {
            _tile_loadd(2, wb + (p - s0 * groups.group), slice_bytes);
            _tile_loadd(3, panel + kTileRows * p, kTileBytes);
            w4a8_dot(u);
          }
        }
        if (ib == 0 && t + 1 < slices) {
          const int64_t share = (g0 - s0) / kGroupsInFlight;
          widen(t + 1, static_cast<int>(kTileRows * share / shares),
                static_cast<int>(kTileRows * (share + 1) / shares));
        }
        for (int u = 0; u < in_flight; ++u) w4a8_store(u, &dots[u][0][0]);
        for (int u = 0; u < in_flight; ++u) {
          const float* scale = slice_scale + (g0 + u - s0) * kTileRows;
#pragma GCC unroll 16
          for (int r = 0; r < kTileRows; ++r) {
            sums[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dots[u][r])), _mm512_set1_ps(scale[r]),
                                      sums[r]);
          }
        }
      }
      for (int r = 0; r < kTileRows; ++r) _mm512_store_ps(total + r * kTileRows, sums[r]);
    }
    if (s1 == count) {
      const int nb = block_rows(n, j);
      for (int64_t ib = 0; ib < a_blocks; ++ib) {
        store_transposed(totals + ib * kTileRows * kTileRows, kTileRows, nb, block_rows(m, ib * kTileRows),
                         a_scale + ib * kTileRows, c + ib * kTileRows * ldc + j, ldc);
      }
    }
  }
  _tile_release();
}

// MXFP4 with the weights as the tiles' first operand, as INT4's: each 32 rows
// of b widen exactly into bf16 rows (x86::mxfp4_block_bf16, a block of 32
// values at a time), with no transpose, and meet the panels of a, made as
// INT4's, in tile_loop; the scales are in the widened values, so the sums
// run over all of K.

// tile_loop's blocks of c^T into c: block row r is row jw + i + r of b, column
// q row j + q of a.
struct StoreTransposed {
  float* c;
  int64_t ldc;
  int64_t jw;
  MOE_X86_INLINE void operator()(int64_t i, int64_t j, int rows, int nb, const int32_t* block) const {
    for (int half = 0; half * kTileRows < nb; ++half) {
      store_transposed(block + half * kTileRows, 2 * kTileRows, rows, std::min(kTileRows, nb - half * kTileRows),
                       nullptr, c + (j + half * kTileRows) * ldc + jw + i, ldc);
    }
  }
};

void gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b, int64_t ldb,
                     const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc) {
  if (m < kMinRows) {
    avx512::gemm_bf16_mxfp4(m, n, k, a, lda, b, ldb, scale, scale_ld, c, ldc);
    return;
  }
  MOE_KERNEL_USE(kGemmBF16Mxfp4);
  constexpr int kRowsOfB = 2 * kTileRows;
  const int64_t k_bytes = 2 * k;  // a multiple of 64: whole tile rows
  const int64_t a_blocks = (m + kTileRows - 1) / kTileRows;
  // The panels of a, then 32 widened rows of b.
  const PreparedRows prepared =
      thread_prepared_rows(ScratchUse::kPanels, (a_blocks + 2) * kTileRows * k_bytes, a, m, k);
  uint8_t* panels = prepared.data;
  auto* w = reinterpret_cast<uint16_t*>(panels + a_blocks * kTileRows * k_bytes);
  for (int64_t ib = 0; ib < a_blocks && !prepared.ready; ++ib) {
    pack_panel(reinterpret_cast<const uint8_t*>(a + ib * kTileRows * lda), 2 * lda, block_rows(m, ib * kTileRows),
               k_bytes, panels + ib * kTileRows * k_bytes);
  }
  for (int64_t jw = 0; jw < n; jw += kRowsOfB) {
    const int rows = static_cast<int>(std::min<int64_t>(kRowsOfB, n - jw));
    for (int r = 0; r < rows; ++r) {
      const uint8_t* src = b + (jw + r) * ldb;
      const uint8_t* row_scale = scale + (jw + r) * scale_ld;
      for (int64_t p = 0; p < k; p += kTileValues) {
        _mm_prefetch(four_bit_ahead(b, ldb, jw + r, p / 2, k / 2), _MM_HINT_T0);
        _mm512_store_si512(w + r * k + p, x86::mxfp4_block_bf16(src + p / 2, row_scale[p / kTileValues]));
      }
    }
    tile_gemm_packed(rows, m, k_bytes, reinterpret_cast<const uint8_t*>(w), k_bytes, panels, DotBF16{},
                     StoreTransposed{c, ldc, jw});
  }
}

// gemm_bf16_fp8 widens once per call onto tiles whatever the rows (below
// kMinRows it hands them to avx512_bf16's registers), so the driver never widens.
bool takes_any_rows(int64_t) { return true; }

void gemm_bf16_tiles(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
                     int64_t ldb, float* c, int64_t ldc) {
  if (m < kMinRows) {
    avx512_bf16::kernels().gemm_bf16_tiles(m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  MOE_KERNEL_USE(kGemmBF16Tiles);
  tile_gemm_packed(m, n, 2 * k, reinterpret_cast<const uint8_t*>(a), 2 * lda, reinterpret_cast<const uint8_t*>(b),
                   DotBF16{}, StoreF32{c, ldc});
}

void gemm_s8_tiles(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                   const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c, int64_t ldc) {
  if (m < kMinRows) {
    avx512_bf16::kernels().gemm_s8_tiles(m, n, k, a, lda, a_scale, b, ldb, b_scale, b_sum, c, ldc);
    return;
  }
  MOE_KERNEL_USE(kGemmS8Tiles);
  tile_gemm_packed(m, n, k, reinterpret_cast<const uint8_t*>(a), lda, reinterpret_cast<const uint8_t*>(b),
                   DotS8{}, StoreScaledS32{a_scale, b_scale, c, ldc});
}

}  // namespace
const KernelSet& amx::kernels() {
  static const KernelSet kernels = above(avx512_bf16::kernels(), [](KernelSet& set) {
    set.gemm_bf16 = gemm_bf16;
    set.gemm_s8 = gemm_s8;
    set.gemm_bf16_fp8 = gemm_bf16_fp8;
    set.gemm_bf16_fp8_takes = takes_any_rows;
    set.gemm_bf16_tiles = gemm_bf16_tiles;
    set.gemm_s8_tiles = gemm_s8_tiles;
    set.gemm_bf16_fp8_tiles = gemm_bf16_fp8_tiles;
    set.gemm_w4a8 = gemm_w4a8;
    set.gemm_bf16_mxfp4 = gemm_bf16_mxfp4;
    set.gemm_bf16_mxfp4_takes = takes_any_rows;
  });
  return kernels;
}

}  // namespace moe_xarch
