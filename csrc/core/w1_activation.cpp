
#include <algorithm>
#include <array>
#include <limits>

#include "core/checked.h"
#include "core/expert_gemm.h"
#include "core/phases.h"
#include "core/stable_torch.h"
#include "core/work_sharing.h"

namespace moe_xarch {

W1Activation::W1Activation(const KernelSet& kernels, const MoeProblem& p, const Routing& routing,
                           const Activations& x)
    : kernels_(kernels),
      p_(p),
      routing_(routing),
      x_(x),
      inter_(kernels, p.compute, routing.slots(), p.inter,
             "the intermediate (a row of N, from w1, per routed slot: up to M x topk rows)"),
      gemm_(kernels, p, p.w1) {
  const int64_t N = p.inter;
  if (p.compute == ComputeType::kInt8) {
    inter_f32_ =
        aligned_buffer<float>(routing.slots(), inter_.ld, "the fp32 intermediate (a row of N per routed slot)");
  }
  const int64_t routed = routing.routed_experts();
  width_ = item_width(kInterBlock, [&](int64_t w) { return routed * ceil_div(N, w); });
  items_ = work_items(routing, p.experts, N, width_);
  // With N = 0 no item writes the rows: their padding is zeroed here.
  if (N == 0) {
    for (int64_t e = 0; e < p.experts; ++e) finish_rows(e);
  }
}

std::vector<int64_t> W1Activation::items_per_expert() const {
  std::vector<int64_t> count(p_.experts, 0);
  for (const WorkItem& item : items_) ++count[item.expert];
  return count;
}

void W1Activation::run(int64_t item, Scratch& scratch, RegionOrder& order) {
  const auto [e, j0] = items_[item];
  const int64_t N = p_.inter, j1 = std::min(N, j0 + width_);
  const bool halves = p_.activation == Activation::kSiluAndMul;  // else gate and up interleave
  const int64_t rows = routing_.rows(e);
  const WeightTile gate = halves ? gemm_.tile(e, j0, j1, rows, x_.ld, scratch, 0)
                                 : gemm_.tile(e, 2 * j0, 2 * j1, rows, x_.ld, scratch, 0);
  const WeightTile up = halves ? gemm_.tile(e, N + j0, N + j1, rows, x_.ld, scratch, kInterBlock) : gate;
  for (int64_t s0 = routing_.expert_begin[e]; s0 < routing_.expert_begin[e + 1]; s0 += kTokenChunk) {
    const int64_t m = std::min(kTokenChunk, routing_.expert_begin[e + 1] - s0);
    gemm_.run(x_, s0, m, gate, scratch.out0.get());
    if (halves) gemm_.run(x_, s0, m, up, scratch.out1.get());
    activate_block(e, j0, j1, m, scratch, s0);
  }
  order.item_done(e, [&] { finish_rows(e); });
}

// The epilogue: bias, activation, store of `m` rows of one column block
// (gate and up in scratch.out0 and out1, or interleaved in out0).
void W1Activation::activate_block(int64_t expert, int64_t j0, int64_t j1, int64_t m, Scratch& scratch,
                                  int64_t first_row) {
  const int64_t width = j1 - j0;
  // Without a bias, a block of zeros stands in for it.
  std::array<float, 2 * kInterBlock> no_bias{};
  const float* bias = p_.w1.bias ? p_.w1.bias + expert * 2 * p_.inter : nullptr;
  const bool halves = p_.activation == Activation::kSiluAndMul;
  const float* bias0 = bias ? bias + (halves ? j0 : 2 * j0) : no_bias.data();
  const float* bias1 = bias ? bias + p_.inter + j0 : no_bias.data();
  const float limit = p_.limit.value_or(std::numeric_limits<float>::infinity());
  const float* out0 = scratch.out0.get();
  const float* out1 = scratch.out1.get();
  std::vector<float>& row = scratch.activated;
  float* out = row.data();
  for (int64_t i = 0; i < m; ++i) {
    if (halves) {
      kernels_.silu_and_mul(width, out0 + i * width, out1 + i * width, bias0, bias1, out);
    } else {
      kernels_.swiglu(width, out0 + i * 2 * width, bias0, p_.alpha, limit, out);
    }
    const int64_t s = first_row + i;
    if (inter_f32_) {
      std::copy(row.begin(), row.begin() + width, inter_f32_.get() + s * inter_.ld + j0);
    } else if (inter_.compute == ComputeType::kBF16) {
      for (int64_t j = 0; j < width; ++j) inter_.bf16[s * inter_.ld + j0 + j] = to_bf16_bits(row[j]);
    } else {
      std::copy(row.begin(), row.begin() + width, inter_.f32.get() + s * inter_.ld + j0);
    }
  }
}

// Once all of an expert's blocks are in: INT8 quantizes whole rows; the
// others zero the padding past N, so padded W2 operands can run over ld.
void W1Activation::finish_rows(int64_t expert) {
  for (int64_t s = routing_.expert_begin[expert]; s < routing_.expert_begin[expert + 1]; ++s) {
    if (inter_f32_) {
      inter_.store_row(s, inter_f32_.get() + s * inter_.ld, p_.inter);
    } else {
      inter_.zero_padding(s, p_.inter);
    }
  }
}

}  // namespace moe_xarch
