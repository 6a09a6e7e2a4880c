// An expert's weights as GEMM operands: tiles of its rows in the form the
// level's kernels take (widened into scratch where the level needs that),
// times rows of activations.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "core/activations.h"
#include "core/buffers.h"
#include "core/kernels.h"
#include "core/problem.h"

namespace moe_xarch {

constexpr int64_t kTokenChunk = 128;  // rows of a per GEMM call: bounds the fp32 tile buffers
// Activation columns per phase-2 work item, at most (work_sharing.h's
// item_width narrows them for many threads): 128 rows of gate and of up,
// which a tile-layout GEMM streams as 4 blocks of 16 side by side at a time.
constexpr int64_t kInterBlock = 128;
constexpr int64_t kHiddenBlock = 128;  // output columns per phase-3 work item, at most (as kInterBlock)

// One thread's scratch for a work item.
struct Scratch {
  AlignedBuffer<float> weights_f32;
  AlignedBuffer<uint16_t> weights_bf16;
  AlignedBuffer<float> out0, out1;
  AlignedBuffer<float> block_sums;  // one block of K's sums, for widened fp8
  std::vector<float> activated;
};

// Rows [r0, r1) of one expert's weight, in the form a GEMM kernel takes.
struct WeightTile {
  const uint8_t* values;
  int64_t ld;
  int64_t k;  // dot length: padded operands (packed rows, widened tiles) run tail-free
  int64_t rows;
  const int32_t* row_sums;     // INT8, may be null
  const float* channel_scale;  // INT8
  bool fp8 = false;            // raw fp8 values for gemm_bf16_fp8, with these scales
  Fp8Scales fp8_scales{};
  float* fp8_block_sums = nullptr;  // set: bf16 values widened from fp8 unscaled; fp8_scales apply per block of K
  bool tiles = false;          // values in the level's tile layout (fp8: kTiles16's line layout)
  bool w4a8 = false;           // INT4 values for gemm_w4a8, with these groups
  Int4Groups groups{};
  bool mxfp4 = false;          // MXFP4 values for gemm_bf16_mxfp4, with these scales
  const uint8_t* mx_scale = nullptr;
  int64_t mx_scale_ld = 0;
};

// Multiplies activation rows by tiles of expert weights: c[i * tile.rows + j], fp32.
class ExpertGemm {
 public:
  ExpertGemm(const KernelSet& kernels, const MoeProblem& p, const WeightOperand& w)
      : kernels_(kernels), p_(p), w_(w) {}

  // Rows [r0, r1) of expert e, for its m activation rows. fp16, fp8 and MXFP4
  // weights are widened into scratch rows [slot, slot + r1 - r0) once for every
  // token chunk; a_ld is the activations' padded width. A tile whose MXFP4
  // scales or INT4 zero points hold a value no weight can have reads nothing
  // (k = 0), and check_values() then names it.
  WeightTile tile(int64_t expert, int64_t r0, int64_t r1, int64_t m, int64_t a_ld, Scratch& scratch,
                  int64_t slot) const;

  // The `m` activation rows starting at `row` times the tile.
  void run(const Activations& a, int64_t row, int64_t m, const WeightTile& w, float* c) const;

  // Rows of weight values one thread's scratch holds.
  static constexpr int64_t kMaxTileRows = std::max(2 * kInterBlock, kHiddenBlock);

  // One thread's scratch for its share of the phase: the output tiles (tile()
  // adds weight tiles if it widens). The rows of a its kernels prepared before
  // are forgotten (core/scratch.h).
  Scratch scratch() const;

  // After a phase: the error for the first expert whose tiles held a bad
  // scale or zero point. Only the routed experts' are read, so only theirs are
  // checked: over every expert, as many bytes as decode reads of weights.
  void check_values() const;

 private:
  bool dequantizes() const;

  // A tile of fp8 widened to bf16: a GEMM per block of K, its sums times their scales in fp32.
  void run_fp8_blocks(const uint16_t* a, int64_t lda, int64_t m, const WeightTile& w, float* c) const;

  // Whether rows [r0, r1) of the expert's MXFP4 scales or INT4 zero points are values a weight can have.
  bool values_valid(int64_t expert, int64_t r0, int64_t r1) const;

  template <typename T, typename Fp8Row, typename Mxfp4Row, typename Convert>
  void widen_rows(const uint8_t* base, int64_t ld, int64_t expert, int64_t r0, int64_t r1, int64_t ld_out,
                  T* out, Fp8Row fp8_row, Mxfp4Row mxfp4_row, Convert convert) const;

  const KernelSet& kernels_;
  const MoeProblem& p_;
  const WeightOperand& w_;
  // The lowest bad expert << 8 | the largest value of its tile: values_valid keeps the minimum.
  mutable std::atomic<int64_t> bad_value_{kNoBadValue};
  static constexpr int64_t kNoBadValue = INT64_MAX;
};

}  // namespace moe_xarch
