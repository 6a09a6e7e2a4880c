// The architecture-neutral body of fused_experts_cpu: its argument checks and
// its driver (the phases in core/phases.h). Each architecture's ops.cpp calls
// it with its kernel set and packing tag.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "core/kernels.h"
#include "core/packing.h"
#include "core/problem.h"

namespace moe_xarch {

// The op's arguments, by reference, in schema order.
struct FusedExpertsArgs {
  const at::Tensor& hidden_states;
  const at::Tensor& w1;
  const at::Tensor& w2;
  const at::Tensor& topk_weights;
  const at::Tensor& topk_ids;
  bool inplace;
  int64_t moe_comp_method;
  const std::optional<at::Tensor>& w1_scale;
  const std::optional<at::Tensor>& w2_scale;
  const std::optional<at::Tensor>& w1_zero;
  const std::optional<at::Tensor>& w2_zero;
  at::OptionalIntArrayRef block_size;
  const std::optional<at::Tensor>& w1_bias;
  const std::optional<at::Tensor>& w2_bias;
  std::optional<double> alpha;
  std::optional<double> limit;
  bool is_vnni;
};

// tiles: the tile layout the running level reads packed weights in (KernelSet::tiles).
MoeProblem check_fused_experts_args(const FusedExpertsArgs& args, PackArch arch, PackLayout tiles);

at::Tensor run_fused_experts(const KernelSet& kernels, PackArch arch, const FusedExpertsArgs& args);

}  // namespace moe_xarch
