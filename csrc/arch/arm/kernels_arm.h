// The aarch64 kernel levels and what they share. Each level's file has its
// own -march; a level with nothing new for a kernel keeps the level below's,
// not a copy. The templates below are in an anonymous namespace on
// purpose: each level instantiates a private copy with its own flags, so the
// linker can never hand a dotprod or i8mm build of a shared helper to a CPU
// that only has NEON.
#pragma once

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>

#include "core/kernels.h"

namespace moe_xarch {

// Each level's set: <level>::kernels().
#define MOE_LEVEL(level, test, flags, files) namespace level { const KernelSet& kernels(); }
#include "arch/arm/levels.def"
#undef MOE_LEVEL

// neon: gemm_neon.cpp. Its bf16 and int8 GEMMs are every level's fallback
// for k below its vector width.
namespace neon {
void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
               float* c, int64_t ldc);
void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale, const int8_t* b,
             int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c, int64_t ldc);
}  // namespace neon

// dotprod: gemm_dotprod.cpp. Its int8 GEMMs are also i8mm's m == 1 (decode)
// path for b in rows: a single row of a would leave half of every 2x2 SMMLA
// tile unused.
namespace dotprod {
void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale, const int8_t* b,
             int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c, int64_t ldc);
void gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale, const uint8_t* b,
               int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc);
}  // namespace dotprod

namespace {

// Bytes of b per column panel: a panel stays in L2 while every row strip of
// a passes over it.
constexpr int64_t kPanelBytes = 256 * 1024;

template <int N>
struct Dim {
  static constexpr int value = N;
};

// The accumulator arrays of a micro-kernel live in registers only if GCC
// scalarizes them, which needs constant indices by the time its SRA pass
// runs: loops over tile rows and columns are unrolled early (MOE_ARM_UNROLL;
// -O3's own complete unrolling comes too late) and the per-step lambdas are
// inlined early. Otherwise acc is stored back to the stack every k step.
#define MOE_ARM_UNROLL _Pragma("GCC unroll 16")
#define MOE_ARM_ALWAYS_INLINE __attribute__((always_inline))
// A tile is a whole k loop: one call per tile costs nothing, and inlining
// every shape into the driver only bloats it. GCC's pre-allocation scheduler
// hoists every load of a k step ahead of the multiplies and then spills
// accumulators; the aarch64 cores this runs on are out of order and do not
// need it.
#if defined(__GNUC__) && !defined(__clang__)
#define MOE_ARM_TILE __attribute__((noinline, optimize("no-schedule-insns")))
#else
#define MOE_ARM_TILE __attribute__((noinline))
#endif
// A pass over the rows of a, once per call, that lays them out for the tiles:
// a symbol of its own, so that benchmarks/mca.py names its loop for what it is.
#define MOE_ARM_ROWS_PASS __attribute__((noinline))

inline int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

// Calls f(Dim<R>{}) with R the smallest multiple of Step not below rows
// (0 < rows <= MR), so that the tile shape is a compile-time constant.
template <int Step, int MR, class F>
inline void with_rows(int64_t rows, F&& f) {
  if constexpr (MR > Step) {
    if (rows <= MR - Step) return with_rows<Step, MR - Step>(rows, f);
  }
  f(Dim<MR>{});
}

// Rows of b in a panel (kPanelBytes of them, a multiple of `tile` rows).
inline int64_t panel_rows(int64_t b_row_bytes, int64_t tile) {
  int64_t panel = kPanelBytes / (b_row_bytes > 0 ? b_row_bytes : 1);
  panel -= panel % tile;
  return panel < tile ? tile : panel;
}

// Covers the m x n output with tiles: tile(Dim<R>, Dim<C>, i, j, mv, nv) for
// the R x C tile at (i, j), of which mv x nv lie inside the output. Rows go
// in strips of MR (the last strip rounded up to a multiple of Step); a strip
// of at most MR / 2 rows uses the wider NR1 columns, which keeps the register
// file full when m is small and makes m == 1 a straight stream over b.
// Panels of b start at multiples of panel_rows(b_row_bytes, NR1); within one,
// the strips come in order, each over all of its columns.
template <int MR, int Step, int NR, int NR1, class Tile>
inline void for_each_tile(int64_t m, int64_t n, int64_t b_row_bytes, Tile&& tile) {
  static_assert(NR1 % NR == 0, "panels hold whole tiles of either width");
  const int64_t panel = panel_rows(b_row_bytes, NR1);
  for (int64_t j0 = 0; j0 < n; j0 += panel) {
    const int64_t j1 = min_i64(n, j0 + panel);
    for (int64_t i = 0; i < m; i += MR) {
      const int64_t mv = min_i64(MR, m - i);
      with_rows<Step, MR>(mv, [&](auto rows) {
        constexpr int R = decltype(rows)::value;
        constexpr int C = 2 * R <= MR ? NR1 : NR;
        for (int64_t j = j0; j < j1; j += C) tile(rows, Dim<C>{}, i, j, mv, min_i64(C, j1 - j));
      });
    }
  }
}

// A 16-byte mask that keeps the last `bytes` bytes: the k tail re-reads the
// final full vector of each row and zeroes what the main loop already counted.
inline uint8x16_t keep_last(int64_t bytes) {
  static const uint8_t kLane[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return vcgeq_u8(vld1q_u8(kLane), vdupq_n_u8(static_cast<uint8_t>(16 - bytes)));
}

// Horizontal sums of four accumulators, one per lane.
inline float32x4_t hsum4(float32x4_t x0, float32x4_t x1, float32x4_t x2, float32x4_t x3) {
  return vpaddq_f32(vpaddq_f32(x0, x1), vpaddq_f32(x2, x3));
}
inline float32x4_t hsum4(int32x4_t x0, int32x4_t x1, int32x4_t x2, int32x4_t x3) {
  return vcvtq_f32_s32(vpaddq_s32(vpaddq_s32(x0, x1), vpaddq_s32(x2, x3)));
}

// The first nv (> 0) of four values starting at p; the rest repeat the last.
inline float32x4_t load4_clamped(const float* p, int64_t nv) {
  if (nv >= 4) return vld1q_f32(p);
  float t[4];
  for (int64_t j = 0; j < 4; ++j) t[j] = p[min_i64(j, nv - 1)];
  return vld1q_f32(t);
}

inline void store4(float* c, float32x4_t v, int64_t nv) {
  if (nv >= 4) {
    vst1q_f32(c, v);
    return;
  }
  float t[4];
  vst1q_f32(t, v);
  for (int64_t j = 0; j < nv; ++j) c[j] = t[j];
}

// Loads for int8 dot-form Ops; each level adds its own mac.
struct S8Io {
  using T = int8_t;
  using Vec = int8x16_t;
  using Acc = int32x4_t;
  static constexpr int kW = 16;
  static constexpr bool kScaled = true;
  static Acc zero() { return vdupq_n_s32(0); }
  static Vec load(const int8_t* p) { return vld1q_s8(p); }
  static Vec load_keep(const int8_t* p, uint8x16_t keep) {
    return vreinterpretq_s8_u8(vandq_u8(vld1q_u8(reinterpret_cast<const uint8_t*>(p)), keep));
  }
};

// Dot-form micro-kernel: R rows of a against C rows of b, one accumulator
// vector per output, reduced across lanes at the end. Ops supplies the
// element type T, the 16-byte step of kW elements (load, load_keep with a
// byte mask, mac into Acc) and kScaled (int8: times a_scale[i] * b_scale[j]).
// Columns past nv re-read the last valid row of b and are not stored.
// Requires k >= kW.
template <class Ops, int R, int C>
MOE_ARM_TILE void dot_tile(int64_t k, const typename Ops::T* a, int64_t lda,
                           const typename Ops::T* b, int64_t ldb, int64_t nv, float* c,
                           int64_t ldc, const float* a_scale, const float* b_scale) {
  static_assert(C % 4 == 0, "columns are reduced four at a time");
  using T = typename Ops::T;
  using Vec = typename Ops::Vec;
  using Acc = typename Ops::Acc;
  constexpr int W = Ops::kW;

  const T* pa[R];
  const T* pb[C];
  MOE_ARM_UNROLL for (int r = 0; r < R; ++r) pa[r] = a + r * lda;
  MOE_ARM_UNROLL for (int j = 0; j < C; ++j) pb[j] = b + min_i64(j, nv - 1) * ldb;

  Acc acc[R][C];
  MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
    MOE_ARM_UNROLL for (int j = 0; j < C; ++j) acc[r][j] = Ops::zero();
  }

  auto step = [&](int64_t p, auto load) MOE_ARM_ALWAYS_INLINE {
    Vec va[R];
    MOE_ARM_UNROLL for (int r = 0; r < R; ++r) va[r] = load(pa[r] + p);
    MOE_ARM_UNROLL for (int j = 0; j < C; ++j) {
      const Vec vb = load(pb[j] + p);
      MOE_ARM_UNROLL for (int r = 0; r < R; ++r) acc[r][j] = Ops::mac(acc[r][j], va[r], vb);
    }
  };
  int64_t p = 0;
  for (; p + W <= k; p += W) step(p, [](const T* q) MOE_ARM_ALWAYS_INLINE { return Ops::load(q); });
  if (p < k) {
    // Both operands are masked: a zero times an Inf already counted would be NaN.
    const uint8x16_t keep = keep_last((k - p) * static_cast<int64_t>(sizeof(T)));
    step(k - W, [keep](const T* q) MOE_ARM_ALWAYS_INLINE { return Ops::load_keep(q, keep); });
  }

  float32x4_t sum[R][C / 4];
  MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
    MOE_ARM_UNROLL for (int j = 0; j < C; j += 4) {
      sum[r][j / 4] = hsum4(acc[r][j], acc[r][j + 1], acc[r][j + 2], acc[r][j + 3]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C && j < nv; j += 4) {
      float32x4_t v = sum[r][j / 4];
      if constexpr (Ops::kScaled) {
        v = vmulq_f32(vmulq_n_f32(v, a_scale[r]), load4_clamped(b_scale + j, nv - j));
      }
      store4(c + r * ldc + j, v, nv - j);
    }
  }
}

// A whole GEMM from dot_tile: MR x NR tiles, MR / 2 x NR1 for small strips.
template <class Ops, int MR, int NR, int NR1>
inline void gemm_dot(int64_t m, int64_t n, int64_t k, const typename Ops::T* a, int64_t lda,
                     const typename Ops::T* b, int64_t ldb, float* c, int64_t ldc,
                     const float* a_scale, const float* b_scale) {
  for_each_tile<MR, 1, NR, NR1>(
      m, n, k * static_cast<int64_t>(sizeof(typename Ops::T)),
      [&](auto rows, auto cols, int64_t i, int64_t j, int64_t, int64_t nv) {
        dot_tile<Ops, decltype(rows)::value, decltype(cols)::value>(
            k, a + i * lda, lda, b + j * ldb, ldb, nv, c + i * ldc + j, ldc,
            a_scale ? a_scale + i : nullptr, b_scale ? b_scale + j : nullptr);
      });
}

}  // namespace
}  // namespace moe_xarch
