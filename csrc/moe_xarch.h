// The one C++ declaration of every moe_xarch op, which each
// csrc/arch/<arch>/ops.cpp defines with exactly these signatures (schemas:
// package/moe_xarch/schemas.txt; contract: the spec).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/stable_torch.h"

namespace moe_xarch {

Tensor fused_experts_cpu(const Tensor& hidden_states, const Tensor& w1,
                         const Tensor& w2, const Tensor& topk_weights,
                         const Tensor& topk_ids, bool inplace, int64_t moe_comp_method,
                         const std::optional<Tensor>& w1_scale,
                         const std::optional<Tensor>& w2_scale,
                         const std::optional<Tensor>& w1_zero,
                         const std::optional<Tensor>& w2_zero,
                         const std::optional<std::vector<int64_t>>& block_size,
                         const std::optional<Tensor>& w1_bias,
                         const std::optional<Tensor>& w2_bias,
                         std::optional<double> alpha, std::optional<double> limit,
                         bool is_vnni);

Tensor convert_weight_packed(const Tensor& weight, int64_t moe_comp_method);

// The bytes of one expert of a weight [E, rows, cols] of dtype that convert_weight_packed makes.
int64_t packed_nbytes(int64_t rows, int64_t cols, ScalarType dtype, int64_t moe_comp_method);

// The kernel path in use ("avx512_bf16", "neon", ...), every path this CPU can run,
// and every path this build carries, lowest first.
std::string isa();
std::vector<std::string> supported_isas();
std::vector<std::string> isa_levels();

// The kernels that ran since the library loaded, as JSON {"kind": {"level": calls}}:
// the level is the one whose code ran (csrc/core/kernel_use.h).
std::string kernel_use();

}  // namespace moe_xarch
