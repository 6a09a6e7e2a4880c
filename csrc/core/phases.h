// The phases of the fused MoE driver (core/fused_experts.cpp), one file each,
// each parallel over independent work items (see the spec for the math).
#pragma once

#include "core/activations.h"
#include "core/buffers.h"
#include "core/kernels.h"
#include "core/problem.h"
#include "core/routing.h"
#include "core/stable_torch.h"

namespace moe_xarch {

// Phase 1 (gather.cpp): each routed token row in the GEMMs' input type (bf16,
// fp32, or int8 quantized per token), one row per routed slot.
Activations gather(const KernelSet& kernels, const MoeProblem& p, const Tensor& hidden_states,
                   const Routing& routing);

// Phase 2 (w1_activation.cpp): per (expert, block of N), h = x @ W1^T + b1
// and its activation, the intermediate (INT8: re-quantized per row).
Activations w1_activation(const KernelSet& kernels, const MoeProblem& p, const Routing& routing,
                          const Activations& x);

// Phase 3 (w2_combine.cpp): per block of K, for every expert, y = a @ W2^T + b2
// times the routing weight, added to its token's fp32 row ([M, K]).
AlignedBuffer<float> w2_combine(const KernelSet& kernels, const MoeProblem& p, const Routing& routing,
                                const Activations& inter);

// Phase 4 (cast_output.cpp): each token's fp32 row cast once into `out`.
void cast_output(const float* acc, Tensor& out);

}  // namespace moe_xarch
