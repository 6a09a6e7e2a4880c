// INT4_W4A8 on aarch64, for every level; a level supplies the integer dot
// product of a 32-value chunk (Dot::chunk) and its tile shapes.
//
// A 16-byte load of b is one chunk, even values in the low nibbles, odd in the
// high. a is split the same way once for every call on the same rows
// (w4a8_split, core/scratch.h's prepared rows), so the nibbles
// multiply a as they are (0..15 is a valid int8) and the tiles load a with
// plain loads: an LD2 in the k loop would take a vector pipe from the
// multiplies. Groups are whole chunks: each output keeps an int32 vector per
// group, whose sum less zero point * sum of a becomes fp32 times the group
// scale once per group; the per-group operands are set out once per call
// (W4A8Operands, with vector transposes; a's group sums once for the same rows).
// In an anonymous namespace (kernels_arm.h says why).
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "arch/arm/kernels_arm.h"
#include "core/kernels.h"
#include "core/scratch.h"

namespace moe_xarch {
namespace {

constexpr int64_t kW4A8Chunk = 32;

struct W4A8Operands {
  int64_t groups;    // of a row: k / group
  int32_t* a_sums;   // [m][groups]
  float* scales;     // [n / 4 rounded up][groups][4]; columns past n repeat the last
  int32_t* zeros;    // likewise

  W4A8Operands(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const Int4Groups& in)
      : groups(k / in.group) {
    const int64_t quads = (n + 3) / 4;
    const int64_t sums_bytes = (m * groups * 4 + 63) / 64 * 64, quad_bytes = quads * groups * 16;
    const PreparedRows prepared = thread_prepared_rows(ScratchUse::kInt4Groups, sums_bytes + 2 * quad_bytes, a, m, k);
    uint8_t* scratch = prepared.data;
    a_sums = reinterpret_cast<int32_t*>(scratch);
    scales = reinterpret_cast<float*>(scratch + sums_bytes);
    zeros = reinterpret_cast<int32_t*>(scratch + sums_bytes + quad_bytes);
    for (int64_t i = 0; i < m && !prepared.ready; ++i) {
      const int8_t* row = a + i * lda;
      for (int64_t g = 0; g < groups; ++g) {
        int32x4_t sum = vdupq_n_s32(0);
        for (int64_t p = g * in.group; p < (g + 1) * in.group; p += 16) {
          sum = vpadalq_s16(sum, vpaddlq_s8(vld1q_s8(row + p)));
        }
        a_sums[i * groups + g] = vaddvq_s32(sum);
      }
    }
    for (int64_t t = 0; t < quads; ++t) {
      const float* scale[4];
      const uint8_t* zero[4];
      for (int q = 0; q < 4; ++q) {
        const int64_t col = min_i64(4 * t + q, n - 1);
        scale[q] = in.scale + col * in.ld;
        zero[q] = in.zero ? in.zero + col * in.ld : nullptr;
      }
      quad_scales(scale, scales + t * groups * 4);
      quad_zeros(zero, zeros + t * groups * 4);
    }
  }

 private:
  // Four columns' scales, group by group: 4 x 4 transposes. The copy is made
  // per call and decode reads it once, so it must cost about what the tiles'
  // own reads of it do (a vector a group and quad).
  void quad_scales(const float* const (&col)[4], float* out) const {
    int64_t g = 0;
    for (; g + 4 <= groups; g += 4) {
      const float32x4_t r0 = vld1q_f32(col[0] + g), r1 = vld1q_f32(col[1] + g);
      const float32x4_t r2 = vld1q_f32(col[2] + g), r3 = vld1q_f32(col[3] + g);
      const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1)), t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
      const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3)), t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
      vst1q_f32(out + 4 * g, vreinterpretq_f32_f64(vzip1q_f64(t0, t2)));
      vst1q_f32(out + 4 * g + 4, vreinterpretq_f32_f64(vzip1q_f64(t1, t3)));
      vst1q_f32(out + 4 * g + 8, vreinterpretq_f32_f64(vzip2q_f64(t0, t2)));
      vst1q_f32(out + 4 * g + 12, vreinterpretq_f32_f64(vzip2q_f64(t1, t3)));
    }
    quad_tail(col, g, out);
  }

  // Their zero points as int32 (null: 8), 4 groups a pass: two byte zips
  // make each 32 bits one group's four, widened twice.
  void quad_zeros(const uint8_t* const (&col)[4], int32_t* out) const {
    int64_t g = 0;
    if (col[0] == nullptr) {
      for (; g < groups; ++g) vst1q_s32(out + 4 * g, vdupq_n_s32(8));
      return;
    }
    for (; g + 4 <= groups; g += 4) {
      uint32_t bits[4];
      for (int q = 0; q < 4; ++q) std::memcpy(&bits[q], col[q] + g, 4);
      // [c0 c2] then [c1 c3] by group, then [c0 c1 c2 c3] by group.
      const uint8x8x2_t pairs = vzip_u8(vreinterpret_u8_u32(vld1_u32(bits)), vreinterpret_u8_u32(vld1_u32(bits + 2)));
      const uint8x8x2_t quads = vzip_u8(pairs.val[0], pairs.val[1]);
      for (int h = 0; h < 2; ++h) {
        const uint16x8_t wide = vmovl_u8(quads.val[h]);
        vst1q_s32(out + 4 * (g + 2 * h), vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(wide))));
        vst1q_s32(out + 4 * (g + 2 * h + 1), vreinterpretq_s32_u32(vmovl_high_u16(wide)));
      }
    }
    quad_tail(col, g, out);
  }

  // Groups from g on, a value at a time: what the passes of four groups leave.
  template <class In, class Out>
  void quad_tail(const In* const (&col)[4], int64_t g, Out* out) const {
    for (; g < groups; ++g) {
      for (int q = 0; q < 4; ++q) out[4 * g + q] = col[q][g];
    }
  }
};

// Rows of a, k apart, each chunk's even values and then its odd ones.
inline MOE_ARM_ROWS_PASS const int8_t* w4a8_split(int64_t m, int64_t k, const int8_t* a, int64_t lda) {
  const PreparedRows prepared = thread_prepared_rows(ScratchUse::kRowsOfA, m * k, a, m, k);
  int8_t* split = reinterpret_cast<int8_t*>(prepared.data);
  for (int64_t i = 0; i < m && !prepared.ready; ++i) {
    for (int64_t p = 0; p < k; p += kW4A8Chunk) {
      const int8x16x2_t x = vld2q_s8(a + i * lda + p);
      vst1q_s8(split + i * k + p, x.val[0]);
      vst1q_s8(split + i * k + p + 16, x.val[1]);
    }
  }
  return split;
}

struct W4A8Call {
  int64_t k, group;
  const int8_t* a;
  int64_t lda;
  const float* a_scale;
  const uint8_t* b;
  int64_t ldb;
  const W4A8Operands& ops;
  float* c;
  int64_t ldc;
};

// The R x C outputs at (i, j), C a multiple of 4 and j of 4; columns past nv
// re-read the last valid row of b and are not stored.
template <class Dot, int R, int C>
MOE_ARM_TILE void w4a8_tile(const W4A8Call& w, int64_t i, int64_t j, int64_t nv) {
  static_assert(C % 4 == 0, "columns go in fours: a vector of scales and zero points");
  constexpr int Q = C / 4;
  const int64_t groups = w.ops.groups;
  const int8_t* pa[R];
  const uint8_t* pb[C];
  MOE_ARM_UNROLL for (int r = 0; r < R; ++r) pa[r] = w.a + (i + r) * w.lda;
  MOE_ARM_UNROLL for (int q = 0; q < C; ++q) pb[q] = w.b + (j + min_i64(q, nv - 1)) * w.ldb;
  const float* scale = w.ops.scales + j / 4 * groups * 4;
  const int32_t* zero = w.ops.zeros + j / 4 * groups * 4;
  const int32_t* sums = w.ops.a_sums + i * groups;
  const uint8x16_t low4 = vdupq_n_u8(15);

  float32x4_t acc[R][Q];
  MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
    MOE_ARM_UNROLL for (int t = 0; t < Q; ++t) acc[r][t] = vdupq_n_f32(0.f);
  }
  for (int64_t g = 0; g < groups; ++g) {
    int32x4_t dot[R][C];
    MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
      MOE_ARM_UNROLL for (int q = 0; q < C; ++q) dot[r][q] = vdupq_n_s32(0);
    }
    for (int64_t p = g * w.group; p < (g + 1) * w.group; p += kW4A8Chunk) {
      int8x16x2_t va[R];
      MOE_ARM_UNROLL for (int r = 0; r < R; ++r) va[r] = {{vld1q_s8(pa[r] + p), vld1q_s8(pa[r] + p + 16)}};
      MOE_ARM_UNROLL for (int q = 0; q < C; ++q) {
        const uint8x16_t x = vld1q_u8(pb[q] + (p >> 1));  // p >= 0: p / 2 would fix its sign every chunk
        const int8x16_t even = vreinterpretq_s8_u8(vandq_u8(x, low4));
        const int8x16_t odd = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));
        MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
          dot[r][q] = Dot::chunk(dot[r][q], even, odd, va[r].val[0], va[r].val[1]);
        }
      }
    }
    MOE_ARM_UNROLL for (int t = 0; t < Q; ++t) {
      const float32x4_t s = vld1q_f32(scale + (t * groups + g) * 4);
      const int32x4_t z = vld1q_s32(zero + (t * groups + g) * 4);
      MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
        int32x4_t d = vpaddq_s32(vpaddq_s32(dot[r][4 * t], dot[r][4 * t + 1]),
                                 vpaddq_s32(dot[r][4 * t + 2], dot[r][4 * t + 3]));
        d = vmlsq_n_s32(d, z, sums[r * groups + g]);
        acc[r][t] = vfmaq_f32(acc[r][t], vcvtq_f32_s32(d), s);
      }
    }
  }
  // Unrolled, so that acc stays in registers: with a loop bounded at run time
  // GCC keeps it in memory and stores it there every group.
  MOE_ARM_UNROLL for (int r = 0; r < R; ++r) {
    MOE_ARM_UNROLL for (int t = 0; t < Q; ++t) {
      if (4 * t >= nv) break;
      store4(w.c + (i + r) * w.ldc + j + 4 * t, vmulq_n_f32(acc[r][t], w.a_scale[i + r]), nv - 4 * t);
    }
  }
}

// The whole GEMM (kernels.h's GemmW4A8Fn) in MR x NR tiles, MR / 2 x NR1 for
// small strips (for_each_tile).
template <class Dot, int MR, int NR, int NR1>
void gemm_w4a8_tiled(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                     const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  const W4A8Operands ops(m, n, k, a, lda, groups);
  const W4A8Call w{k, groups.group, w4a8_split(m, k, a, lda), k, a_scale, b, ldb, ops, c, ldc};
  for_each_tile<MR, 1, NR, NR1>(m, n, k / 2, [&](auto rows, auto cols, int64_t i, int64_t j, int64_t, int64_t nv) {
    w4a8_tile<Dot, decltype(rows)::value, decltype(cols)::value>(w, i, j, nv);
  });
}

}  // namespace
}  // namespace moe_xarch
