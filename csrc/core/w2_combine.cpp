
#include <algorithm>
#include <array>

#include "core/checked.h"
#include "core/expert_gemm.h"
#include "core/phases.h"
#include "core/stable_torch.h"
#include "core/work_sharing.h"

namespace moe_xarch {

W2Combine::W2Combine(const KernelSet& kernels, const MoeProblem& p, const Routing& routing, const Activations& inter)
    : kernels_(kernels),
      p_(p),
      routing_(routing),
      inter_(inter),
      acc_(aligned_buffer<float>(p.tokens, p.hidden, "the fp32 output accumulator ([M, K] of hidden_states)")),
      gemm_(kernels, p, p.w2),
      turn_(p.experts, 0) {
  const int64_t K = p.hidden, routed = routing.routed_experts();
  width_ = item_width(kHiddenBlock, [&](int64_t w) { return routed * ceil_div(K, w); });
  blocks_ = ceil_div(K, width_);
  items_ = work_items(routing, p.experts, K, width_);
  for (int64_t e = 0, turn = 0; e < p.experts; ++e) {
    if (routing.rows(e) > 0) turn_[e] = turn++;
  }
  // No routed rows: no item zeroes the output.
  if (items_.empty()) std::fill(acc_.get(), acc_.get() + p.tokens * K, 0.f);
}

// The first chunk of the expert's rows is multiplied before the wait for the
// block's turn, the adds (and any later chunks) in it. In expert order,
// blocks inside, two experts' items of one block lie as many items apart as
// there are blocks, so with as many blocks as threads a turn seldom waits;
// an expert's items stream its W2 rows in order, and its intermediate rows
// stay in cache across them.
bool W2Combine::run(int64_t item, Scratch& scratch, RegionOrder& order) {
  const auto [e, k0] = items_[item];
  const int64_t M = p_.tokens, K = p_.hidden, k1 = std::min(K, k0 + width_), cols = k1 - k0;
  const int64_t block = k0 / width_;
  if (!order.wait_finished(e)) return false;
  const std::array<float, kHiddenBlock> no_bias{};
  const float* bias = p_.w2.bias ? p_.w2.bias + e * K + k0 : no_bias.data();
  float* acc = acc_.get();
  const WeightTile w = gemm_.tile(e, k0, k1, routing_.rows(e), inter_.ld, scratch, 0);
  bool my_turn = false;
  for (int64_t s0 = routing_.expert_begin[e]; s0 < routing_.expert_begin[e + 1]; s0 += kTokenChunk) {
    const int64_t m = std::min(kTokenChunk, routing_.expert_begin[e + 1] - s0);
    float* c = scratch.out0.get();
    gemm_.run(inter_, s0, m, w, c);
    if (!my_turn) {
      if (!order.wait_turn(block, turn_[e])) return false;
      my_turn = true;
      // The first expert of the block starts its columns from zero.
      if (turn_[e] == 0) {
        for (int64_t t = 0; t < M; ++t) std::fill(acc + t * K + k0, acc + t * K + k1, 0.f);
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      kernels_.add_weighted(cols, routing_.weight[s0 + i], c + i * cols, bias, acc + routing_.token[s0 + i] * K + k0);
    }
  }
  order.pass_turn(block);
  return true;
}

}  // namespace moe_xarch
