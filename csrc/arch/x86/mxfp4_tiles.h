// The fused MXFP4 GEMM of few rows of a (KernelSet::gemm_bf16_mxfp4), ISA-neutral:
// a level brings its vector operations (an Op) and gets the tiles and the
// loop nest (loop_nest.h). Templates in an anonymous namespace, as there.
//
// A step of Op::kStep values of K: its bytes of b are looked up in registers
// into Op::kParts vectors (decode) whose lanes each hold values of one block of
// 32, the same block in every part, so one vector of scales multiplies the lane
// sums of all parts. The few rows of a are put once in the order the lookup
// leaves b's values in (Op::reorder), rather than every vector of b put back
// in K's order: a dot product sums its lanes in the end.
//
// An Op has:
//   A                     the type of a's values, as the parts multiply them
//   Vec, Acc              a part, and the lane sums
//   kStep, kParts         values of K a step, parts a step (kStep / kParts lanes of A each)
//   kSums                 independent sums a row's parts of a step go into: one chains every
//                         part's multiply-add, so a step takes kParts times its latency
//   reorder(a, values, out) a step of a row of a in the parts' order, as A (values, a
//                         multiple of 32, from a; zeros past them)
//   decode(b, bytes, v)   v = the parts of the step's first `bytes` bytes of b (zeros past them)
//   scales(s, blocks)     the step's scales by lane (blocks of them from s; past them, any finite value)
//   madd(acc, a, v)       acc += a's part (at a, in memory) times v, lane by lane
//   scaled(acc, s, total) total + acc * s
//   store<NR>(total, c, nb) the lane sums of NR totals, the first nb of them into c
#pragma once

#include "arch/x86/inline.h"
#include "arch/x86/loop_nest.h"
#include "core/kernels.h"
#include "core/scratch.h"

namespace moe_xarch::x86 {
namespace {

template <class Op>
struct Mxfp4Tiles {
  static constexpr int kMR = 4;
  static constexpr int kNR = Op::kNR;
  static constexpr int kNR1 = Op::kNR1;
  static constexpr int64_t kKBlock = 0;  // the tiles walk all of K (their rows of a are few)
  static constexpr bool kRowsInOrder = true;
  using T = uint8_t;
  using A = typename Op::A;
  static constexpr int64_t kLanes = Op::kStep / Op::kParts;

  const A* a;  // reordered rows, lda apart, zeros past k
  int64_t lda;
  const uint8_t* b;
  int64_t ldb;
  const uint8_t* scale;
  int64_t scale_ld;
  float* c;
  int64_t ldc;

  int64_t row_bytes() const { return ldb; }

  // total += the step of `values` values of K (a multiple of 32) from p on:
  // a whole step (a constant) or the tail.
  template <int MR, int NR>
  MOE_X86_INLINE void step(const A* const (&pa)[MR], const uint8_t* const (&pb)[NR], const uint8_t* const (&ps)[NR],
                           int64_t p, int64_t values, int64_t ahead, typename Op::Acc (&total)[MR][NR]) const {
    for (int q = 0; q < NR; ++q) {
      // The weights stream from memory once: the bytes that come next, into
      // L2 (the fused fp8 GEMM's reason).
      __builtin_prefetch(pb[q] + ahead + p / 2, 0, 2);
      typename Op::Vec v[Op::kParts];
      Op::decode(pb[q] + p / 2, values / 2, v);
      const typename Op::Acc s = Op::scales(ps[q] + p / 32, values / 32);
      for (int r = 0; r < MR; ++r) {
        typename Op::Acc acc[Op::kSums];
        for (int u = 0; u < Op::kSums; ++u) acc[u] = Op::zero();
        for (int t = 0; t < Op::kParts; ++t) {
          acc[t % Op::kSums] = Op::madd(acc[t % Op::kSums], pa[r] + p + t * kLanes, v[t]);
        }
        for (int u = 0; u < Op::kSums; ++u) total[r][q] = Op::scaled(acc[u], s, total[r][q]);
      }
    }
  }

  // total += all of K: its whole steps, then the tail.
  template <int MR, int NR>
  MOE_X86_INLINE void steps(const A* const (&pa)[MR], const uint8_t* const (&pb)[NR], const uint8_t* const (&ps)[NR],
                            int64_t k, int64_t ahead, typename Op::Acc (&total)[MR][NR]) const {
    int64_t p = 0;
    for (; p + Op::kStep <= k; p += Op::kStep) step<MR, NR>(pa, pb, ps, p, Op::kStep, ahead, total);
    if (p < k) step<MR, NR>(pa, pb, ps, p, k - p, ahead, total);
  }

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const TileCols& cols, int64_t /*p0*/, int64_t k, bool /*first*/) {
    const A* pa[MR];
    const uint8_t* pb[NR];
    const uint8_t* ps[NR];
    for (int r = 0; r < MR; ++r) pa[r] = a + (i + r) * lda;
    for (int q = 0; q < NR; ++q) {
      const int64_t j = cols.at(q);
      pb[q] = b + j * ldb;
      ps[q] = scale + j * scale_ld;
    }
    typename Op::Acc total[MR][NR];
    for (int r = 0; r < MR; ++r) {
      for (int q = 0; q < NR; ++q) total[r][q] = Op::zero();
    }
    if constexpr (MR == 1) {
      // Decode: the tile's rows of b, adjacent (kRowsInOrder), one after
      // another, so that b is one stream.
      for (int q = 0; q < NR; ++q) {
        typename Op::Acc row_total[1][1] = {{Op::zero()}};
        const uint8_t* const row_b[1] = {pb[q]};
        const uint8_t* const row_scale[1] = {ps[q]};
        steps<1, 1>(pa, row_b, row_scale, k, kStreamAhead, row_total);
        total[0][q] = row_total[0][0];
      }
    } else {
      steps<MR, NR>(pa, pb, ps, k, cols.ahead * ldb, total);
    }
    // Reduced before store_cols, whose lambda would otherwise take the
    // totals' address and keep them in memory through the loop above.
    for (int r = 0; r < MR; ++r) {
      float sums[NR];
      Op::template store<NR>(total[r], sums, cols.nb);
      store_cols<NR>(c + (i + r) * ldc + cols.j, cols, false, [&](float* dst, bool) {
        for (int q = 0; q < cols.nb; ++q) dst[q] = sums[q];
      });
    }
  }
};

// The Op's GEMM: a's rows reordered once, into this thread's scratch, for
// every call on the same rows (thread_prepared_rows).
template <class Op>
MOE_X86_INLINE void gemm_bf16_mxfp4_with(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                                         const uint8_t* b, int64_t ldb, const uint8_t* scale, int64_t scale_ld,
                                         float* c, int64_t ldc) {
  using A = typename Op::A;
  const int64_t steps = (k + Op::kStep - 1) / Op::kStep;
  const int64_t ld = steps * Op::kStep;
  const PreparedRows prepared =
      thread_prepared_rows(ScratchUse::kRowsOfA, m * ld * static_cast<int64_t>(sizeof(A)), a, m, k);
  A* rows = reinterpret_cast<A*>(prepared.data);
  for (int64_t i = 0; i < m && !prepared.ready; ++i) {
    for (int64_t p = 0; p < k; p += Op::kStep) {
      Op::reorder(a + i * lda + p, k - p < Op::kStep ? k - p : Op::kStep, rows + i * ld + p);
    }
  }
  Mxfp4Tiles<Op> t{rows, ld, b, ldb, scale, scale_ld, c, ldc};
  gemm_tiled(t, m, n, k);
}

}  // namespace
}  // namespace moe_xarch::x86
