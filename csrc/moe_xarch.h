// The one C++ declaration of every moe_xarch op. Each architecture defines
// these functions in csrc/arch/<arch>/ops.cpp with exactly these signatures; a
// definition that drifts ("no declaration matches ...") fails that build.
// The schemas live in package/moe_xarch/schemas.txt, the contract in the spec.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <optional>
#include <string>
#include <vector>

namespace moe_xarch {

at::Tensor fused_experts_cpu(const at::Tensor& hidden_states, const at::Tensor& w1,
                             const at::Tensor& w2, const at::Tensor& topk_weights,
                             const at::Tensor& topk_ids, bool inplace, int64_t moe_comp_method,
                             const std::optional<at::Tensor>& w1_scale,
                             const std::optional<at::Tensor>& w2_scale,
                             const std::optional<at::Tensor>& w1_zero,
                             const std::optional<at::Tensor>& w2_zero,
                             at::OptionalIntArrayRef block_size,
                             const std::optional<at::Tensor>& w1_bias,
                             const std::optional<at::Tensor>& w2_bias,
                             std::optional<double> alpha, std::optional<double> limit,
                             bool is_vnni);

at::Tensor convert_weight_packed(const at::Tensor& weight, int64_t moe_comp_method);

int64_t packed_nbytes(int64_t rows, int64_t cols, at::ScalarType dtype);

// The kernel path in use ("avx512_bf16", "neon", ...), every path this CPU can run,
// and every path this build carries, lowest first.
std::string isa();
std::vector<std::string> supported_isas();
std::vector<std::string> isa_levels();

// The kernels that ran since the library loaded, as JSON {"kind": {"level": calls}}:
// the level is the one whose code ran (csrc/core/kernel_use.h).
std::string kernel_use();

}  // namespace moe_xarch
