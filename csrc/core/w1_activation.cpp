
#include <algorithm>
#include <array>
#include <limits>

#include "core/checked.h"
#include "core/expert_gemm.h"
#include "core/phases.h"
#include "core/stable_torch.h"
#include "core/work_sharing.h"

namespace moe_xarch {
namespace {

// The epilogue: bias, activation, store of `m` rows of one column block
// (gate and up in scratch.out0 and out1, or interleaved in out0).
void activate_block(const KernelSet& kernels, const MoeProblem& p, int64_t expert, int64_t j0, int64_t j1,
                    int64_t m, Scratch& scratch, Activations& inter, int64_t first_row, float* inter_f32) {
  const int64_t width = j1 - j0;
  // Without a bias, a block of zeros stands in for it.
  std::array<float, 2 * kInterBlock> no_bias{};
  const float* bias = p.w1.bias ? p.w1.bias + expert * 2 * p.inter : nullptr;
  const bool halves = p.activation == Activation::kSiluAndMul;
  const float* bias0 = bias ? bias + (halves ? j0 : 2 * j0) : no_bias.data();
  const float* bias1 = bias ? bias + p.inter + j0 : no_bias.data();
  const float limit = p.limit.value_or(std::numeric_limits<float>::infinity());
  const float* out0 = scratch.out0.get();
  const float* out1 = scratch.out1.get();
  std::vector<float>& row = scratch.activated;
  float* out = row.data();
  for (int64_t i = 0; i < m; ++i) {
    if (halves) {
      kernels.silu_and_mul(width, out0 + i * width, out1 + i * width, bias0, bias1, out);
    } else {
      kernels.swiglu(width, out0 + i * 2 * width, bias0, p.alpha, limit, out);
    }
    const int64_t s = first_row + i;
    if (inter_f32) {
      std::copy(row.begin(), row.begin() + width, inter_f32 + s * inter.ld + j0);
    } else if (inter.compute == ComputeType::kBF16) {
      for (int64_t j = 0; j < width; ++j) inter.bf16[s * inter.ld + j0 + j] = to_bf16_bits(row[j]);
    } else {
      std::copy(row.begin(), row.begin() + width, inter.f32.get() + s * inter.ld + j0);
    }
  }
}

}  // namespace

Activations w1_activation(const KernelSet& kernels, const MoeProblem& p, const Routing& routing,
                          const Activations& x) {
  const int64_t slots = routing.slots(), N = p.inter;
  Activations inter(kernels, p.compute, slots, N,
                    "the intermediate (a row of N, from w1, per routed slot: up to M x topk rows)");
  AlignedBuffer<float> inter_f32;  // INT8 re-quantizes whole rows after the blocks are done
  if (p.compute == ComputeType::kInt8) {
    inter_f32 = aligned_buffer<float>(slots, inter.ld, "the fp32 intermediate (a row of N per routed slot)");
  }
  const ExpertGemm gemm1(kernels, p, p.w1);
  const int64_t routed = routing.routed_experts();
  const int64_t width = item_width(kInterBlock, [&](int64_t w) { return routed * ceil_div(N, w); });
  const auto items = work_items(routing, p.experts, N, width);
  const auto make_scratch = [&] { return gemm1.scratch(); };
  for_each_shared_item(static_cast<int64_t>(items.size()), make_scratch, [&](int64_t item, Scratch& scratch) {
    const auto [e, j0] = items[item];
    const int64_t j1 = std::min(N, j0 + width);
    const bool halves = p.activation == Activation::kSiluAndMul;  // else gate and up interleave
    const int64_t rows = routing.rows(e);
    const WeightTile gate = halves ? gemm1.tile(e, j0, j1, rows, x.ld, scratch, 0)
                                   : gemm1.tile(e, 2 * j0, 2 * j1, rows, x.ld, scratch, 0);
    const WeightTile up = halves ? gemm1.tile(e, N + j0, N + j1, rows, x.ld, scratch, kInterBlock) : gate;
    for (int64_t s0 = routing.expert_begin[e]; s0 < routing.expert_begin[e + 1]; s0 += kTokenChunk) {
      const int64_t m = std::min(kTokenChunk, routing.expert_begin[e + 1] - s0);
      gemm1.run(x, s0, m, gate, scratch.out0.get());
      if (halves) gemm1.run(x, s0, m, up, scratch.out1.get());
      activate_block(kernels, p, e, j0, j1, m, scratch, inter, s0, inter_f32.get());
    }
  });
  gemm1.check_values();
  if (p.compute == ComputeType::kInt8) {
    parallel_for(0, slots, 16, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) inter.store_row(s, inter_f32.get() + s * inter.ld, N);
    });
  } else {
    // Zero the padding past N so padded W2 operands can run over inter.ld.
    parallel_for(0, slots, 64, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) inter.zero_padding(s, N);
    });
  }
  return inter;
}

}  // namespace moe_xarch
