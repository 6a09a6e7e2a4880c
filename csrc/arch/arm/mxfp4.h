// MXFP4 times few rows of bf16 a on aarch64 (kernels.h's GemmBF16Mxfp4Fn), for
// every level; a level supplies a 32-value block's products (Ops::block) and its
// tile shapes. b is widened in registers, never stored: every E2M1 value is
// exact in bf16, so TBL looks up the low and high bytes of each value's bf16
// bits from the block's 16 bytes (even values in the low nibbles) and a byte
// zip joins them; a is put in the same order once for every call on the same
// rows (mxfp4_split_rows, core/scratch.h's prepared rows).
// Each block's sum times its E8M0 scale (exact in fp32) adds into the total.
// In an anonymous namespace (kernels_arm.h says why).
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "arch/arm/kernels_arm.h"
#include "core/e8m0.h"
#include "core/scratch.h"

namespace moe_xarch {
namespace {

constexpr int64_t kMxfp4Block = 32;

// Rows of a, k apart, each block as four vectors of 8 values: the even values
// 0-7 and 8-15, then the odd ones (the order of a decoded block of b), stored
// by Ops::store_a (as bf16, or widened).
template <class Ops>
MOE_ARM_ROWS_PASS const typename Ops::A* mxfp4_split_rows(int64_t m, int64_t k, const uint16_t* a, int64_t lda) {
  using A = typename Ops::A;
  const PreparedRows prepared =
      thread_prepared_rows(ScratchUse::kRowsOfA, m * k * static_cast<int64_t>(sizeof(A)), a, m, k);
  A* split = reinterpret_cast<A*>(prepared.data);
  for (int64_t i = 0; i < m && !prepared.ready; ++i) {
    for (int64_t p = 0; p < k; p += kMxfp4Block) {
      const uint16x8x2_t first = vld2q_u16(a + i * lda + p), second = vld2q_u16(a + i * lda + p + 16);
      A* out = split + i * k + p;
      Ops::store_a(out, first.val[0]);
      Ops::store_a(out + 8, second.val[0]);
      Ops::store_a(out + 16, first.val[1]);
      Ops::store_a(out + 24, second.val[1]);
    }
  }
  return split;
}

// The R x C outputs at c (ldc apart) of R rows of mxfp4_split_rows's a (k
// apart) and C rows of b (ldb bytes apart) with their scales (scale_ld
// apart), C a multiple of 4; columns past nv re-read the last valid row of b
// and are not stored.
template <class Ops, int R, int C>
MOE_ARM_TILE void mxfp4_tile(int64_t k, const typename Ops::A* a, const uint8_t* b, int64_t ldb,
                             const uint8_t* scale, int64_t scale_ld, int64_t nv, float* c, int64_t ldc) {
  using A = typename Ops::A;
  using AVec = typename Ops::AVec;
  const A* pa[R];
  const uint8_t* pb[C];
  const uint8_t* ps[C];
  MOE_ARM_UNROLL for (int r = 0; r < R; ++r) pa[r] = a + r * k;
  MOE_ARM_UNROLL for (int q = 0; q < C; ++q) {
    const int64_t row = min_i64(q, nv - 1);
    pb[q] = b + row * ldb;
    ps[q] = scale + row * scale_ld;
  }
  const uint8x16_t low = vld1q_u8(kE2m1Low.value), high = vld1q_u8(kE2m1High.value), low4 = vdupq_n_u8(15);

  float32x4_t total[R][C];
  MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
    MOE_ARM_UNROLL for (int q = 0; q < C; ++q) total[r][q] = vdupq_n_f32(0.f);
  }
  for (int64_t t = 0; t < k / kMxfp4Block; ++t) {
    AVec va[R][4];
    MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
      MOE_ARM_UNROLL for (int h = 0; h < 4; ++h) va[r][h] = Ops::load_a(pa[r] + t * kMxfp4Block + 8 * h);
    }
    MOE_ARM_UNROLL for (int q = 0; q < C; ++q) {
      const uint8x16_t x = vld1q_u8(pb[q] + t * kMxfp4Block / 2);
      const uint8x16_t even = vandq_u8(x, low4), odd = vshrq_n_u8(x, 4);
      const uint8x16_t lo_even = vqtbl1q_u8(low, even), hi_even = vqtbl1q_u8(high, even);
      const uint8x16_t lo_odd = vqtbl1q_u8(low, odd), hi_odd = vqtbl1q_u8(high, odd);
      const uint16x8_t vb[4] = {vreinterpretq_u16_u8(vzip1q_u8(lo_even, hi_even)),
                                vreinterpretq_u16_u8(vzip2q_u8(lo_even, hi_even)),
                                vreinterpretq_u16_u8(vzip1q_u8(lo_odd, hi_odd)),
                                vreinterpretq_u16_u8(vzip2q_u8(lo_odd, hi_odd))};
      const float s = kE8m0.value[ps[q][t]];
      MOE_ARM_UNROLL for (int r = 0; r < R; ++r) total[r][q] = vfmaq_n_f32(total[r][q], Ops::block(va[r], vb), s);
    }
  }
  // Unrolled, as w4a8_tile's stores are (w4a8.h says why).
  MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
    MOE_ARM_UNROLL for (int q = 0; q < C; q += 4) {
      if (q >= nv) break;
      store4(c + r * ldc + q, hsum4(total[r][q], total[r][q + 1], total[r][q + 2], total[r][q + 3]), nv - q);
    }
  }
}

// Whether the level's fused GEMM takes m rows of a: up to a tile's.
template <class Ops>
bool mxfp4_takes(int64_t m) {
  return m <= Ops::kMR;
}

// The whole GEMM in tiles of Ops::kMR rows (for_each_tile; k is a multiple
// of 32, rows of b k / 2 bytes of values).
template <class Ops>
void gemm_bf16_mxfp4_tiled(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                           int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc) {
  const typename Ops::A* split = mxfp4_split_rows<Ops>(m, k, a, lda);
  for_each_tile<Ops::kMR, 1, Ops::kNR, Ops::kNR1>(m, n, k / 2, [&](auto rows, auto cols, int64_t i, int64_t j,
                                                                   int64_t, int64_t nv) {
    mxfp4_tile<Ops, decltype(rows)::value, decltype(cols)::value>(k, split + i * k, b + j * ldb, ldb,
                                                                  scale + j * scale_ld, scale_ld, nv,
                                                                  c + i * ldc + j, ldc);
  });
}

}  // namespace
}  // namespace moe_xarch
