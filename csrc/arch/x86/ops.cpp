// The x86_64 definitions of the ops of csrc/moe_xarch.h (arch/arm/ops.cpp says
// why by qualified name, and one file per architecture).
#include "core/dispatch.h"
#include "core/fused_experts.h"
#include "moe_xarch.h"

namespace {
constexpr moe_xarch::PackArch kArch = moe_xarch::PackArch::kX86_64;
}

moe_xarch::Tensor moe_xarch::fused_experts_cpu(
    const Tensor& hidden_states, const Tensor& w1, const Tensor& w2,
    const Tensor& topk_weights, const Tensor& topk_ids, bool inplace,
    int64_t moe_comp_method, const std::optional<Tensor>& w1_scale,
    const std::optional<Tensor>& w2_scale, const std::optional<Tensor>& w1_zero,
    const std::optional<Tensor>& w2_zero, const std::optional<std::vector<int64_t>>& block_size,
    const std::optional<Tensor>& w1_bias, const std::optional<Tensor>& w2_bias,
    std::optional<double> alpha, std::optional<double> limit, bool is_vnni) {
  return run_fused_experts(active_kernels(), kArch,
                           {hidden_states, w1, w2, topk_weights, topk_ids, inplace,
                            moe_comp_method, w1_scale, w2_scale, w1_zero, w2_zero, block_size,
                            w1_bias, w2_bias, alpha, limit, is_vnni});
}

moe_xarch::Tensor moe_xarch::convert_weight_packed(const Tensor& weight, int64_t moe_comp_method) {
  return pack_weights(weight, moe_comp_method, kArch, active_kernels().tiles);
}
