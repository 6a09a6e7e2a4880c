// Armv8.6-A matrix multiply-accumulate: SMMLA (int8) and BFMMLA (bf16) each
// compute a 2x2 output block from two rows of a and two of b, twice the work of
// a dot-product instruction. Two rows zipped by 64-bit halves are exactly the
// operand each wants: a's are zipped once per call (mmla_pairs), packed b lies
// so already (kTiles2) and is read as it lies, b in rows is zipped in the tile
// (a vector op per two MMLAs).
// INT4_W4A8 by SMMLA too, from two rows of a (four SMMLAs a chunk where four
// outputs by SDOT take eight), a in the matching order once per call
// (w4a8_pairs), b's nibbles unpacked once per panel from three strips of
// rows on; one row of a is dotprod's kernel, as for int8. MXFP4 by BFDOT
// for one or two rows of a (mxfp4.h); more rows widen it once for the BFMMLA
// tiles. fp32 stays on NEON's kernel.
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>

#include "arch/arm/kernels_arm.h"
#include "arch/arm/mxfp4.h"
#include "arch/arm/w4a8.h"
#include "core/kernel_use.h"
#include "core/kernels.h"

namespace moe_xarch {
namespace {

// MMLA Ops: kW elements per 16 bytes; mmla takes the zipped operands as
// bytes; add sums two chains; to_f32 turns a finished 2x2 accumulator into
// floats.
struct MmlaS8 {
  using T = int8_t;
  using Acc = int32x4_t;
  static constexpr int kW = 16;
  static constexpr bool kScaled = true;
  static Acc zero() { return vdupq_n_s32(0); }
  static Acc add(Acc x, Acc y) { return vaddq_s32(x, y); }
  static Acc mmla(Acc acc, uint8x16_t a, uint8x16_t b) {
    return vmmlaq_s32(acc, vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(b));
  }
  static float32x4_t to_f32(Acc acc) { return vcvtq_f32_s32(acc); }
};

struct MmlaBF16 {
  using T = uint16_t;
  using Acc = float32x4_t;
  static constexpr int kW = 8;
  static constexpr bool kScaled = false;
  static Acc zero() { return vdupq_n_f32(0.f); }
  static Acc add(Acc x, Acc y) { return vaddq_f32(x, y); }
  static Acc mmla(Acc acc, uint8x16_t a, uint8x16_t b) {
    return vbfmmlaq_f32(acc, vreinterpretq_bf16_u8(a), vreinterpretq_bf16_u8(b));
  }
  static float32x4_t to_f32(Acc acc) { return acc; }
};

// bf16 with one row of a (decode): BFDOT, as the unused half of a BFMMLA
// would be wasted.
struct BF16DotOps {
  using T = uint16_t;
  using Vec = bfloat16x8_t;
  using Acc = float32x4_t;
  static constexpr int kW = 8;
  static constexpr bool kScaled = false;
  static Acc zero() { return vdupq_n_f32(0.f); }
  static Vec load(const uint16_t* p) { return vreinterpretq_bf16_u16(vld1q_u16(p)); }
  static Vec load_keep(const uint16_t* p, uint8x16_t keep) {
    return vreinterpretq_bf16_u8(vandq_u8(vld1q_u8(reinterpret_cast<const uint8_t*>(p)), keep));
  }
  static Acc mac(Acc acc, Vec a, Vec b) { return vbfdotq_f32(acc, a, b); }
};

// MXFP4's block (mxfp4.h) by BFDOT on a as it is, one chain: a second would
// cost a register copy of its zero start (BFDOT accumulates in place) and an add.
struct Mxfp4BFDot {
  using A = uint16_t;
  using AVec = bfloat16x8_t;
  static constexpr int kMR = 2, kNR = 4, kNR1 = 4;
  static void store_a(uint16_t* dst, uint16x8_t x) { vst1q_u16(dst, x); }
  static AVec load_a(const uint16_t* p) { return vreinterpretq_bf16_u16(vld1q_u16(p)); }
  static float32x4_t block(const AVec (&a)[4], const uint16x8_t (&b)[4]) {
    float32x4_t sum = vdupq_n_f32(0.f);
    MOE_ARM_UNROLL for (int h = 0; h < 4; ++h) sum = vbfdotq_f32(sum, a[h], vreinterpretq_bf16_u16(b[h]));
    return sum;
  }
};

uint8x16_t zip_lo(uint8x16_t x, uint8x16_t y) {
  return vreinterpretq_u8_u64(vzip1q_u64(vreinterpretq_u64_u8(x), vreinterpretq_u64_u8(y)));
}
uint8x16_t zip_hi(uint8x16_t x, uint8x16_t y) {
  return vreinterpretq_u8_u64(vzip2q_u64(vreinterpretq_u64_u8(x), vreinterpretq_u64_u8(y)));
}

// Up to two floats of one output row; nv (> 0) of them inside the output.
void store2(float* c, float32x2_t v, int64_t nv) {
  if (nv >= 2) {
    vst1_f32(c, v);
  } else {
    c[0] = vget_lane_f32(v, 0);
  }
}

// The 16-byte steps of k of an MMLA tile: the k tail is one more step, at
// k - kW, masked to what the full steps did not count.
template <class Ops>
int64_t mmla_steps(int64_t k) {
  return (k + Ops::kW - 1) / Ops::kW;
}

// Rows of a for the MMLA tiles, zipped once for every call on the same rows
// (core/scratch.h's prepared rows) rather than in every tile's k loop, where
// the zips would take a third of the vector pipes from the MMLAs: per pair of
// rows (the last row of an odd m repeated) and step, 32 bytes, rows 2i and
// 2i+1 zipped by 64-bit halves into the operand of the step's first half, then
// that of its second.
template <class Ops>
MOE_ARM_ROWS_PASS const uint8_t* mmla_pairs(int64_t m, int64_t k, const typename Ops::T* a, int64_t lda) {
  constexpr int W = Ops::kW;
  constexpr int64_t kSize = static_cast<int64_t>(sizeof(typename Ops::T));
  const int64_t steps = mmla_steps<Ops>(k);
  const PreparedRows prepared = thread_prepared_rows(ScratchUse::kRowsOfA, (m + 1) / 2 * steps * 32, a, m, k);
  uint8_t* pairs = prepared.data;
  const uint8x16_t keep = keep_last((k - (steps - 1) * W) * kSize);
  for (int64_t i = 0; i < m && !prepared.ready; i += 2) {
    const auto* x_row = reinterpret_cast<const uint8_t*>(a + i * lda);
    const auto* y_row = reinterpret_cast<const uint8_t*>(a + min_i64(i + 1, m - 1) * lda);
    uint8_t* dst = pairs + i / 2 * steps * 32;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t p = min_i64(s * W, k - W);
      uint8x16_t x = vld1q_u8(x_row + p * kSize), y = vld1q_u8(y_row + p * kSize);
      if (p != s * W) {
        x = vandq_u8(x, keep);
        y = vandq_u8(y, keep);
      }
      vst1q_u8(dst + s * 32, zip_lo(x, y));
      vst1q_u8(dst + s * 32 + 16, zip_hi(x, y));
    }
  }
  return pairs;
}

// b as natural rows: per step (mmla_steps), rows 2q and 2q+1 zip into column
// pair q's operands for the two halves of the step, as a's did. Columns past
// nv re-read the last valid row of b. Requires k >= kW.
template <class Ops, int C>
struct RowsOfB {
  using T = typename Ops::T;
  static constexpr bool kOperandsAsLoaded = false;
  static constexpr int64_t kSize = static_cast<int64_t>(sizeof(T));
  const uint8_t* rows[C];
  int64_t k;

  RowsOfB(const T* b, int64_t ldb, int64_t nv, int64_t k_) : k(k_) {
    MOE_ARM_UNROLL for (int j = 0; j < C; ++j) {
      rows[j] = reinterpret_cast<const uint8_t*>(b + min_i64(j, nv - 1) * ldb);
    }
  }

  // step(s, operands) for each step s of k, operands(q) column pair q's two.
  template <class Step>
  MOE_ARM_ALWAYS_INLINE void for_each_step(Step step) const {
    constexpr int W = Ops::kW;
    auto zipped = [this](int64_t offset, auto load) MOE_ARM_ALWAYS_INLINE {
      return [this, offset, load](int q) MOE_ARM_ALWAYS_INLINE {
        const uint8x16_t x = load(rows[2 * q] + offset), y = load(rows[2 * q + 1] + offset);
        return uint8x16x2_t{{zip_lo(x, y), zip_hi(x, y)}};
      };
    };
    int64_t p = 0, s = 0;
    for (; p + W <= k; p += W, ++s) {
      step(s, zipped(p * kSize, [](const uint8_t* q) MOE_ARM_ALWAYS_INLINE { return vld1q_u8(q); }));
    }
    if (p < k) {
      const uint8x16_t keep = keep_last((k - p) * kSize);
      step(s, zipped((k - W) * kSize,
                     [keep](const uint8_t* q) MOE_ARM_ALWAYS_INLINE { return vandq_u8(vld1q_u8(q), keep); }));
    }
  }
};

// b in the kTiles2 layout (core/packed_layout.h): column pair q's two operands
// of step s are the 32 bytes of its lines 2s and 2s + 1, as they lie. k == ldb
// is a multiple of kPackAlign values, so there is no tail. Column pairs past
// nv re-read the last valid pair.
template <class Ops, int C>
struct TilesOfB {
  static_assert(kTiles2Shape.rows == 2 && kTiles2Shape.chunk == 8, "one line pair of the layout per operand pair");
  static constexpr bool kOperandsAsLoaded = true;
  const uint8_t* pairs[C / 2];
  int64_t steps;

  TilesOfB(const typename Ops::T* b, int64_t ldb, int64_t nv, int64_t k) : steps(k / Ops::kW) {
    MOE_ARM_UNROLL for (int q = 0; q < C / 2; ++q) {
      pairs[q] = reinterpret_cast<const uint8_t*>(b + min_i64(2 * q, nv - 2) * ldb);
    }
  }

  template <class Step>
  MOE_ARM_ALWAYS_INLINE void for_each_step(Step step) const {
    for (int64_t s = 0; s < steps; ++s) {
      // Two loads, not one vld1q_u8_x2: its register pair makes GCC copy bf16
      // accumulators around every BFMMLA.
      step(s, [this, s](int q) MOE_ARM_ALWAYS_INLINE {
        return uint8x16x2_t{{vld1q_u8(pairs[q] + s * 32), vld1q_u8(pairs[q] + s * 32 + 16)}};
      });
    }
  }
};

// R x C outputs (both even) as R/2 x C/2 blocks of 2x2, from R/2 row pairs
// of mmla_pairs (steps apart) and C columns of b, read by B (RowsOfB,
// TilesOfB). Rows past mv are the pairs' repeated rows, columns past nv
// B's repeated ones; neither is stored.
template <class Ops, int R, int C, template <class, int> class B>
MOE_ARM_TILE void mmla_tile(int64_t k, const uint8_t* pairs, int64_t steps, const typename Ops::T* b_rows,
                            int64_t ldb, int64_t mv, int64_t nv, float* c, int64_t ldc, const float* a_scale,
                            const float* b_scale) {
  static_assert(R % 2 == 0 && C % 2 == 0, "2x2 blocks");
  using Acc = typename Ops::Acc;
  constexpr int RP = R / 2;
  constexpr int CP = C / 2;
  // Built here, not passed in: the tile's caller would store it to the stack for every tile.
  const B<Ops, C> b(b_rows, ldb, nv, k);

  const uint8_t* pa[RP];
  MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) pa[r] = pairs + r * steps * 32;

  // One row pair: each block in two chains, one per half of a step, so that
  // the MMLA's latency does not bound the tile; more pairs have the registers
  // for one chain only.
  constexpr int kChains = RP == 1 ? 2 : 1;
  Acc acc[kChains][RP][CP];
  MOE_ARM_UNROLL for (int h = 0; h < kChains; ++h) {
    MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
      MOE_ARM_UNROLL for (int j = 0; j < CP; ++j) acc[h][r][j] = Ops::zero();
    }
  }
  b.for_each_step([&](int64_t s, auto operands) MOE_ARM_ALWAYS_INLINE {
    if constexpr (RP > 1 && CP <= 4 && B<Ops, C>::kOperandsAsLoaded) {
      // The step's b operands first, then a row pair at a time: in the other
      // order GCC copies a BFMMLA accumulator to another register and back.
      // Wider tiles' operands would not fit in registers beside the accumulators.
      uint8x16x2_t v[CP];
      MOE_ARM_UNROLL for (int j = 0; j < CP; ++j) v[j] = operands(j);
      MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
        const uint8x16_t lo = vld1q_u8(pa[r] + s * 32), hi = vld1q_u8(pa[r] + s * 32 + 16);
        MOE_ARM_UNROLL for (int j = 0; j < CP; ++j) acc[0][r][j] = Ops::mmla(acc[0][r][j], lo, v[j].val[0]);
        MOE_ARM_UNROLL for (int j = 0; j < CP; ++j) acc[0][r][j] = Ops::mmla(acc[0][r][j], hi, v[j].val[1]);
      }
    } else {  // a column pair at a time: RowsOfB's zips need registers, and one row pair has two chains
      uint8x16_t lo[RP], hi[RP];
      MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
        lo[r] = vld1q_u8(pa[r] + s * 32);
        hi[r] = vld1q_u8(pa[r] + s * 32 + 16);
      }
      MOE_ARM_UNROLL for (int j = 0; j < CP; ++j) {
        const uint8x16x2_t v = operands(j);
        MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) acc[0][r][j] = Ops::mmla(acc[0][r][j], lo[r], v.val[0]);
        MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
          acc[kChains - 1][r][j] = Ops::mmla(acc[kChains - 1][r][j], hi[r], v.val[1]);
        }
      }
    }
  });
  if constexpr (kChains == 2) {
    MOE_ARM_UNROLL for (int j = 0; j < CP; ++j) acc[0][0][j] = Ops::add(acc[0][0][j], acc[1][0][j]);
  }

  // Block (r, j) holds [a0.b0, a0.b1, a1.b0, a1.b1] for rows 2r, 2r+1 and
  // columns 2j, 2j+1.
  float32x4_t out[RP][CP];
  MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
    MOE_ARM_UNROLL for (int j = 0; j < CP; ++j) out[r][j] = Ops::to_f32(acc[0][r][j]);
  }
  for (int r = 0; r < RP && 2 * r < mv; ++r) {
    float* c0 = c + 2 * r * ldc;
    float32x4_t sa = vdupq_n_f32(1.f);
    if constexpr (Ops::kScaled) {
      sa = vcombine_f32(vdup_n_f32(a_scale[2 * r]),
                        vdup_n_f32(a_scale[min_i64(2 * r + 1, mv - 1)]));
    }
    for (int j = 0; j < CP && 2 * j < nv; ++j) {
      float32x4_t v = out[r][j];
      if constexpr (Ops::kScaled) {
        const float sb[2] = {b_scale[2 * j], b_scale[min_i64(2 * j + 1, nv - 1)]};
        const float32x2_t vb = vld1_f32(sb);
        v = vmulq_f32(vmulq_f32(v, sa), vcombine_f32(vb, vb));
      }
      store2(c0 + 2 * j, vget_low_f32(v), nv - 2 * j);
      if (2 * r + 1 < mv) store2(c0 + ldc + 2 * j, vget_high_f32(v), nv - 2 * j);
    }
  }
}

// Rows of a for the W4A8 SMMLA tiles: per pair of rows (the last row of an odd
// m repeated) and chunk, 64 bytes, the operands of its four SMMLAs: the even
// values of the chunk's first half of each row, then of its second half, then
// the odd values likewise (each 8 bytes of one row, then 8 of the other).
// After them, per pair and group, the rows' group sums as the zero points'
// term wants them against a 2x2 block: [s0 s0 s1 s1], one load a group.
struct W4A8Pairs {
  const int8_t* rows;
  const int32_t* sums;
};

MOE_ARM_ROWS_PASS W4A8Pairs w4a8_pairs(int64_t m, int64_t k, const int8_t* a, int64_t lda, const W4A8Operands& ops) {
  const int64_t chunks = k / kW4A8Chunk, groups = ops.groups, pair_count = (m + 1) / 2;
  const int64_t rows_bytes = pair_count * chunks * 64;
  const PreparedRows prepared =
      thread_prepared_rows(ScratchUse::kRowsOfA, rows_bytes + pair_count * groups * 16, a, m, k);
  int8_t* pairs = reinterpret_cast<int8_t*>(prepared.data);
  int32_t* sums = reinterpret_cast<int32_t*>(prepared.data + rows_bytes);
  for (int64_t i = 0; i < m && !prepared.ready; i += 2) {
    const int64_t i1 = min_i64(i + 1, m - 1);
    const int8_t* r0 = a + i * lda;
    const int8_t* r1 = a + i1 * lda;
    int8_t* dst = pairs + i / 2 * chunks * 64;
    for (int64_t t = 0; t < chunks; ++t) {
      const int8x16x2_t x = vld2q_s8(r0 + t * kW4A8Chunk), y = vld2q_s8(r1 + t * kW4A8Chunk);
      for (int h = 0; h < 2; ++h) {
        const uint8x16_t u = vreinterpretq_u8_s8(x.val[h]), v = vreinterpretq_u8_s8(y.val[h]);
        vst1q_u8(reinterpret_cast<uint8_t*>(dst + t * 64 + 32 * h), zip_lo(u, v));
        vst1q_u8(reinterpret_cast<uint8_t*>(dst + t * 64 + 32 * h + 16), zip_hi(u, v));
      }
    }
    for (int64_t g = 0; g < groups; ++g) {
      vst1q_s32(sums + (i / 2 * groups + g) * 4, vcombine_s32(vdup_n_s32(ops.a_sums[i * groups + g]),
                                                              vdup_n_s32(ops.a_sums[i1 * groups + g])));
    }
  }
  return {pairs, sums};
}

// Where a tile of C columns keeps pair q's operands (below) of the chunk at
// p: chunk after chunk, each chunk's pairs together (64 bytes a pair), so
// that the tile reads them as one stream at offsets known when compiling. A
// tile's operands over all of K take C * k bytes.
template <int C>
int64_t kept_at(int q, int64_t p) {
  return p * C + 64 * q;
}

// The SMMLA operands of b for a W4A8 tile, per pair of rows q (columns 2q,
// 2q + 1 of the tile) and chunk at p: four vectors, the even values of the
// chunk's first half of each row (8 bytes of one row, then 8 of the other),
// of its second half, then the odd values likewise.
//
// From the rows' nibbles, the last valid row repeated past nv; kKeep: also
// stored at `kept` for the strips of rows below that meet the same columns.
template <int C, bool kKeep>
struct NibbleOperands {
  const uint8_t* row[C];
  int8_t* kept;

  NibbleOperands(const W4A8Call& w, int64_t j, int64_t nv, int8_t* kept_at) : kept(kept_at) {
    MOE_ARM_UNROLL for (int q = 0; q < C; ++q) row[q] = w.b + (j + min_i64(q, nv - 1)) * w.ldb;
  }
  MOE_ARM_ALWAYS_INLINE void get(int q, int64_t p, int8x16_t (&vb)[4]) const {
    const uint8x16_t low4 = vdupq_n_u8(15);
    // p >= 0: p / 2 would fix its sign every chunk.
    const uint8x16_t x = vld1q_u8(row[2 * q] + (p >> 1)), y = vld1q_u8(row[2 * q + 1] + (p >> 1));
    const uint8x16_t first = zip_lo(x, y), second = zip_hi(x, y);
    vb[0] = vreinterpretq_s8_u8(vandq_u8(first, low4));
    vb[1] = vreinterpretq_s8_u8(vandq_u8(second, low4));
    vb[2] = vreinterpretq_s8_u8(vshrq_n_u8(first, 4));
    vb[3] = vreinterpretq_s8_u8(vshrq_n_u8(second, 4));
    if constexpr (kKeep) {
      MOE_ARM_UNROLL for (int h = 0; h < 4; ++h) vst1q_s8(kept + kept_at<C>(q, p) + 16 * h, vb[h]);
    }
  }
};

// As a NibbleOperands<C, true> of the first strip stored them.
template <int C>
struct KeptOperands {
  const int8_t* kept;

  MOE_ARM_ALWAYS_INLINE void get(int q, int64_t p, int8x16_t (&vb)[4]) const {
    MOE_ARM_UNROLL for (int h = 0; h < 4; ++h) vb[h] = vld1q_s8(kept + kept_at<C>(q, p) + 16 * h);
  }
};

// W4A8's R x C outputs at (i, j) (w4a8.h's w4a8_tile) as R/2 x C/2 blocks of
// 2x2, [a0.b0, a0.b1, a1.b0, a1.b1] as in mmla_tile, with b's operands from
// B (NibbleOperands or KeptOperands, by value: as a reference, every store
// of kept operands made GCC load its pointers again); i is even and rows past
// mv are pairs' repeated rows.
template <int R, int C, class B>
MOE_ARM_TILE void w4a8_mmla_tile(const W4A8Call& w, const W4A8Pairs& pairs, B b, int64_t i, int64_t j, int64_t mv,
                                 int64_t nv) {
  static_assert(R % 2 == 0 && C % 4 == 0, "2x2 blocks, columns in fours (their scales)");
  constexpr int RP = R / 2;
  constexpr int CP = C / 2;
  const int64_t groups = w.ops.groups, chunks = w.k / kW4A8Chunk;
  const int8_t* pa[RP];
  MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) pa[r] = pairs.rows + (i / 2 + r) * chunks * 64;
  const float* scale = w.ops.scales + j / 4 * groups * 4;
  const int32_t* zero = w.ops.zeros + j / 4 * groups * 4;

  float32x4_t acc[RP][CP];
  MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
    MOE_ARM_UNROLL for (int q = 0; q < CP; ++q) acc[r][q] = vdupq_n_f32(0.f);
  }
  for (int64_t g = 0; g < groups; ++g) {
    int32x4_t dot[RP][CP];
    MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
      MOE_ARM_UNROLL for (int q = 0; q < CP; ++q) dot[r][q] = vdupq_n_s32(0);
    }
    for (int64_t p = g * w.group; p < (g + 1) * w.group; p += kW4A8Chunk) {
      // Four loads, not one vld1q_s8_x4: its register quad makes GCC copy it.
      int8x16_t va[RP][4];
      MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
        MOE_ARM_UNROLL for (int h = 0; h < 4; ++h) va[r][h] = vld1q_s8(pa[r] + p * 2 + 16 * h);
      }
      MOE_ARM_UNROLL for (int q = 0; q < CP; ++q) {
        int8x16_t vb[4];
        b.get(q, p, vb);
        MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
          MOE_ARM_UNROLL for (int h = 0; h < 4; ++h) dot[r][q] = vmmlaq_s32(dot[r][q], va[r][h], vb[h]);
        }
      }
    }
    int32x4_t sums[RP];
    MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) sums[r] = vld1q_s32(pairs.sums + ((i / 2 + r) * groups + g) * 4);
    // A quad of columns' zero points and scales, a load each, then each pair's
    // two in both halves by a ZIP (8-byte loads came with a DUP each).
    MOE_ARM_UNROLL for (int t = 0; t < CP / 2; ++t) {
      const int64x2_t z4 = vreinterpretq_s64_s32(vld1q_s32(zero + (t * groups + g) * 4));
      const int64x2_t s4 = vreinterpretq_s64_f32(vld1q_f32(scale + (t * groups + g) * 4));
      MOE_ARM_UNROLL for (int h = 0; h < 2; ++h) {
        const int q = 2 * t + h;
        const int32x4_t z = vreinterpretq_s32_s64(h ? vzip2q_s64(z4, z4) : vzip1q_s64(z4, z4));
        const float32x4_t s = vreinterpretq_f32_s64(h ? vzip2q_s64(s4, s4) : vzip1q_s64(s4, s4));
        MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
          acc[r][q] = vfmaq_f32(acc[r][q], vcvtq_f32_s32(vmlsq_s32(dot[r][q], z, sums[r])), s);
        }
      }
    }
  }
  // Unrolled, as w4a8_tile's stores are (w4a8.h says why).
  MOE_ARM_UNROLL for (int r = 0; r < RP; ++r) {
    if (2 * r >= mv) break;
    float* c0 = w.c + (i + 2 * r) * w.ldc + j;
    const float32x4_t sa = vcombine_f32(vdup_n_f32(w.a_scale[i + 2 * r]),
                                        vdup_n_f32(w.a_scale[i + min_i64(2 * r + 1, mv - 1)]));
    MOE_ARM_UNROLL for (int q = 0; q < CP; ++q) {
      if (2 * q >= nv) break;
      const float32x4_t v = vmulq_f32(acc[r][q], sa);
      store2(c0 + 2 * q, vget_low_f32(v), nv - 2 * q);
      if (2 * r + 1 < mv) store2(c0 + w.ldc + 2 * q, vget_high_f32(v), nv - 2 * q);
    }
  }
}

// 8 x 8 tiles (16 accumulators), 2 or 4 rows x 16 columns for small strips,
// b read by B.
template <class Ops, template <class, int> class B>
void gemm_mmla(int64_t m, int64_t n, int64_t k, const typename Ops::T* a, int64_t lda,
               const typename Ops::T* b, int64_t ldb, float* c, int64_t ldc, const float* a_scale,
               const float* b_scale) {
  const uint8_t* pairs = mmla_pairs<Ops>(m, k, a, lda);
  const int64_t steps = mmla_steps<Ops>(k);
  for_each_tile<8, 2, 8, 16>(
      m, n, k * static_cast<int64_t>(sizeof(typename Ops::T)),
      [&](auto rows, auto cols, int64_t i, int64_t j, int64_t mv, int64_t nv) {
        mmla_tile<Ops, decltype(rows)::value, decltype(cols)::value, B>(
            k, pairs + i / 2 * steps * 32, steps, b + j * ldb, ldb, mv, nv, c + i * ldc + j, ldc,
            a_scale ? a_scale + i : nullptr, b_scale ? b_scale + j : nullptr);
      });
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
               float* c, int64_t ldc) {
  if (k < MmlaBF16::kW) return neon::gemm_bf16(m, n, k, a, lda, b, ldb, c, ldc);
  MOE_KERNEL_USE(kGemmBF16);
  if (m == 1) {
    return gemm_dot<BF16DotOps, 1, 8, 8>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr);
  }
  gemm_mmla<MmlaBF16, RowsOfB>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr);
}

// b_sum is unused: SMMLA is signed times signed.
void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale, const int8_t* b,
             int64_t ldb, const float* b_scale, const int32_t* b_sum, float* c, int64_t ldc) {
  if (m == 1) return dotprod::gemm_s8(m, n, k, a, lda, a_scale, b, ldb, b_scale, b_sum, c, ldc);
  if (k < MmlaS8::kW) return neon::gemm_s8(m, n, k, a, lda, a_scale, b, ldb, b_scale, b_sum, c, ldc);
  MOE_KERNEL_USE(kGemmS8);
  gemm_mmla<MmlaS8, RowsOfB>(m, n, k, a, lda, b, ldb, c, ldc, a_scale, b_scale);
}

// b in the kTiles2 layout, decode included: one row of a uses half of each
// MMLA, as many MACs an instruction as the dot product's kernel.
void gemm_bf16_tiles(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
                     int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Tiles);
  gemm_mmla<MmlaBF16, TilesOfB>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr);
}

void gemm_s8_tiles(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                   const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* /*b_sum*/, float* c,
                   int64_t ldc) {
  MOE_KERNEL_USE(kGemmS8Tiles);
  gemm_mmla<MmlaS8, TilesOfB>(m, n, k, a, lda, b, ldb, c, ldc, a_scale, b_scale);
}

void gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
               const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  if (m == 1) return dotprod::gemm_w4a8(m, n, k, a, lda, a_scale, b, ldb, groups, c, ldc);
  MOE_KERNEL_USE(kGemmW4A8);
  const W4A8Operands ops(m, n, k, a, lda, groups);
  const W4A8Call w{k, groups.group, a, lda, a_scale, b, ldb, ops, c, ldc};
  const W4A8Pairs pairs = w4a8_pairs(m, k, a, lda, ops);
  // From the third strip of rows on, the first strip unpacks each panel of b
  // once into this thread's scratch (panels sized by their unpacked bytes, k
  // a row), and the strips below read it there: their SMMLAs then have the
  // vector pipes to themselves. The first strip's stores cost about what one
  // strip's unpacking saves.
  constexpr int kStrip = 4, kCols = 8;
  const bool keep = m > 2 * kStrip;
  const int64_t panel = panel_rows(k, kCols);
  int8_t* kept = keep ? reinterpret_cast<int8_t*>(thread_scratch(ScratchUse::kPanels, panel * k)) : nullptr;
  for_each_tile<kStrip, 2, kCols, kCols>(m, n, k, [&](auto rows, auto cols, int64_t i, int64_t j, int64_t mv,
                                                      int64_t nv) {
    constexpr int R = decltype(rows)::value, C = decltype(cols)::value;
    int8_t* at = keep ? kept + j % panel * k : nullptr;  // the tile's operands (kept_at)
    if (!keep) {
      w4a8_mmla_tile<R, C>(w, pairs, NibbleOperands<C, false>(w, j, nv, nullptr), i, j, mv, nv);
    } else if (i == 0) {
      w4a8_mmla_tile<R, C>(w, pairs, NibbleOperands<C, true>(w, j, nv, at), i, j, mv, nv);
    } else {
      w4a8_mmla_tile<R, C>(w, pairs, KeptOperands<C>{at}, i, j, mv, nv);
    }
  });
}

bool gemm_bf16_mxfp4_takes(int64_t m) { return mxfp4_takes<Mxfp4BFDot>(m); }

void gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                     int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Mxfp4);
  gemm_bf16_mxfp4_tiled<Mxfp4BFDot>(m, n, k, a, lda, b, ldb, scale, scale_ld, c, ldc);
}

}  // namespace

const KernelSet& i8mm::kernels() {
  static const KernelSet kernels = above(dotprod::kernels(), [](KernelSet& set) {
    set.gemm_bf16 = gemm_bf16;
    set.gemm_s8 = gemm_s8;
    set.tiles = PackLayout::kTiles2;
    set.gemm_bf16_tiles = gemm_bf16_tiles;
    set.gemm_s8_tiles = gemm_s8_tiles;
    set.gemm_w4a8 = gemm_w4a8;
    set.gemm_bf16_mxfp4 = gemm_bf16_mxfp4;
    set.gemm_bf16_mxfp4_takes = gemm_bf16_mxfp4_takes;
  });
  return kernels;
}

}  // namespace moe_xarch
