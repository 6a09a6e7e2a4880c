// The architecture-neutral body of fused_experts_cpu: its argument checks and
// its driver (the phases in core/phases.h). Each architecture's ops.cpp calls
// it with its kernel set and packing tag.
#pragma once

#include <optional>

#include "core/kernels.h"
#include "core/packing.h"
#include "core/problem.h"
#include "core/stable_torch.h"

namespace moe_xarch {

// The op's arguments, by reference, in schema order.
struct FusedExpertsArgs {
  const Tensor& hidden_states;
  const Tensor& w1;
  const Tensor& w2;
  const Tensor& topk_weights;
  const Tensor& topk_ids;
  bool inplace;
  int64_t moe_comp_method;
  const std::optional<Tensor>& w1_scale;
  const std::optional<Tensor>& w2_scale;
  const std::optional<Tensor>& w1_zero;
  const std::optional<Tensor>& w2_zero;
  const std::optional<std::vector<int64_t>>& block_size;
  const std::optional<Tensor>& w1_bias;
  const std::optional<Tensor>& w2_bias;
  std::optional<double> alpha;
  std::optional<double> limit;
  bool is_vnni;
};

// tiles: the tile layout the running level reads packed weights in (KernelSet::tiles).
MoeProblem check_fused_experts_args(const FusedExpertsArgs& args, PackArch arch, PackLayout tiles);

Tensor run_fused_experts(const KernelSet& kernels, PackArch arch, const FusedExpertsArgs& args);

}  // namespace moe_xarch
