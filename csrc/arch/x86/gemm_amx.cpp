// AMX: the avx512_bf16 level with its bf16 and int8 GEMMs on tile matrix
// multiplies (tdpbf16ps, tdpbssd: 16 x 16 outputs over 64 bytes of K per
// instruction) once there are enough rows of a to fill tiles; everything
// else is avx512_bf16's.
//
// A tile multiply wants its right operand as 4-byte groups of K interleaved
// across 16 columns ("VNNI" layout); weights are rows of K values, so each
// 16-row block of b is transposed (as 16 x 16 groups) into a panel once per
// call and then meets every row block of a.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "arch/x86/kernels_x86.h"
#include "core/kernels.h"

namespace moe_kernels {
namespace {

// Below this many rows of a, the transposes cost more than tiles save.
constexpr int64_t kMinRows = 4;
constexpr int kTileRows = 16;
constexpr int64_t kTileBytes = 64;  // of K per tile row: 32 bf16 or 64 int8 values

// Tiles: 0, 1 accumulate c (two 16-column blocks); 2 holds a; 3, 4 the panels.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  explicit TileConfig(int a_rows) {
    for (int t = 0; t < 5; ++t) {
      colsb[t] = 64;
      rows[t] = static_cast<uint8_t>(t <= 2 ? a_rows : kTileBytes / 4);
    }
  }
};

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
// panel of tiles: tile row g holds 4-byte group g (2 bf16 or 4 int8 values of
// K) of each of the 16 rows.
void pack_panel(const uint8_t* b, int64_t ldb, int rows, int64_t k_bytes, uint8_t* panel) {
  for (int64_t p = 0; p < k_bytes; p += kTileBytes) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_si512(b + i * ldb + p) : _mm512_setzero_si512();
    transpose16x16(r);
    for (int i = 0; i < 16; ++i) _mm512_store_si512(panel + p * kTileRows + i * kTileBytes, r[i]);
  }
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// The loop nest of both tile GEMMs, on bytes: blocks of 16 rows of a (tile
// 2) meet 32 rows of b (panels in tiles 3, 4) over all of K, into tiles 0, 1.
// Each 16 x 32 block of results is handed to finish(i, j, rows, nb, block),
// block being 32 values a row.
template <class Dot, class Finish>
void tile_gemm(int64_t m, int64_t n, int64_t k_bytes, const uint8_t* a, int64_t lda, const uint8_t* b,
               int64_t ldb, Dot dot, Finish finish) {
  thread_local int64_t capacity = 0;
  thread_local std::unique_ptr<uint8_t[], AlignedFree> panels;
  const int64_t panel_bytes = k_bytes * kTileRows;
  if (capacity < 2 * panel_bytes) {
    panels.reset(static_cast<uint8_t*>(std::aligned_alloc(64, 2 * panel_bytes)));
    capacity = 2 * panel_bytes;
  }
  uint8_t* panel0 = panels.get();
  uint8_t* panel1 = panel0 + panel_bytes;
  alignas(64) int32_t block[kTileRows * 2 * kTileRows];
  int configured = 0;
  for (int64_t j = 0; j < n; j += 2 * kTileRows) {
    const int64_t nb = n - j < 2 * kTileRows ? n - j : 2 * kTileRows;
    pack_panel(b + j * ldb, ldb, static_cast<int>(nb < kTileRows ? nb : kTileRows), k_bytes, panel0);
    if (nb > kTileRows) pack_panel(b + (j + kTileRows) * ldb, ldb, static_cast<int>(nb - kTileRows), k_bytes, panel1);
    for (int64_t i = 0; i < m; i += kTileRows) {
      const int rows = static_cast<int>(m - i < kTileRows ? m - i : kTileRows);
      if (rows != configured) {
        const TileConfig config(rows);
        _tile_loadconfig(&config);
        configured = rows;
      }
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t p = 0; p < k_bytes; p += kTileBytes) {
        _tile_loadd(2, a + i * lda + p, lda);
        _tile_loadd(3, panel0 + p * kTileRows, kTileBytes);
        dot.first();
        if (nb > kTileRows) {
          _tile_loadd(4, panel1 + p * kTileRows, kTileBytes);
          dot.second();
        }
      }
      _tile_stored(0, block, 2 * kTileRows * sizeof(int32_t));
      _tile_stored(1, block + kTileRows, 2 * kTileRows * sizeof(int32_t));
      finish(i, j, rows, static_cast<int>(nb), block);
    }
  }
  _tile_release();
}

// The tile intrinsics take register numbers as literals.
struct DotBF16 {
  MOE_X86_INLINE void first() const { _tile_dpbf16ps(0, 2, 3); }
  MOE_X86_INLINE void second() const { _tile_dpbf16ps(1, 2, 4); }
};

struct DotS8 {
  MOE_X86_INLINE void first() const { _tile_dpbssd(0, 2, 3); }
  MOE_X86_INLINE void second() const { _tile_dpbssd(1, 2, 4); }
};

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc) {
  if (m < kMinRows || k % (kTileBytes / 2) != 0) {
    kernels_avx512_bf16().gemm_bf16(m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  tile_gemm(m, n, 2 * k, reinterpret_cast<const uint8_t*>(a), 2 * lda, reinterpret_cast<const uint8_t*>(b),
            2 * ldb, DotBF16{}, [&](int64_t i, int64_t j, int rows, int nb, const int32_t* block) {
              for (int r = 0; r < rows; ++r) {
                std::memcpy(c + (i + r) * ldc + j, block + r * 2 * kTileRows, nb * sizeof(float));
              }
            });
}

// Signed times signed (tdpbssd): no bias, so b_sum is not needed.
void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
             const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c, int64_t ldc) {
  if (m < kMinRows || k % kTileBytes != 0) {
    kernels_avx512_bf16().gemm_s8(m, n, k, a, lda, a_scale, b, ldb, b_scale, b_sum, c, ldc);
    return;
  }
  tile_gemm(m, n, k, reinterpret_cast<const uint8_t*>(a), lda, reinterpret_cast<const uint8_t*>(b), ldb,
            DotS8{}, [&](int64_t i, int64_t j, int rows, int nb, const int32_t* block) {
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
            });
}

}  // namespace

const KernelSet& kernels_amx() {
  static const KernelSet kernels = [] {
    KernelSet set = kernels_avx512_bf16();
    set.isa = "amx";
    set.gemm_bf16 = gemm_bf16;
    set.gemm_s8 = gemm_s8;
    return set;
  }();
  return kernels;
}

}  // namespace moe_kernels
