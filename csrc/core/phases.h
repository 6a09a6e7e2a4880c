// The phases of the fused MoE driver (core/fused_experts.cpp), one file each,
// each parallel over work items (see the spec for the math).
#pragma once

#include <cstdint>
#include <vector>

#include "core/activations.h"
#include "core/buffers.h"
#include "core/expert_gemm.h"
#include "core/kernels.h"
#include "core/problem.h"
#include "core/region_order.h"
#include "core/routing.h"
#include "core/stable_torch.h"

namespace moe_xarch {

// Phase 1 (gather.cpp): each routed token row in the GEMMs' input type (bf16,
// fp32, or int8 quantized per token), one row per routed slot.
Activations gather(const KernelSet& kernels, const MoeProblem& p, const Tensor& hidden_states,
                   const Routing& routing);

// Phases 2 and 3 run in one parallel region (core/fused_experts.cpp), in
// the order core/region_order.h keeps.

// Phase 2 (w1_activation.cpp): per (expert, block of N), h = x @ W1^T + b1
// and its activation; the item that ends an expert's last re-quantizes its
// intermediate rows (INT8) or zeroes their padding.
class W1Activation {
 public:
  W1Activation(const KernelSet& kernels, const MoeProblem& p, const Routing& routing, const Activations& x);

  int64_t items() const { return static_cast<int64_t>(items_.size()); }
  // Each expert's items, for RegionOrder.
  std::vector<int64_t> items_per_expert() const;
  Scratch scratch() const { return gemm_.scratch(); }
  void run(int64_t item, Scratch& scratch, RegionOrder& order);
  // After the region: as ExpertGemm::check_values.
  void check_values() const { gemm_.check_values(); }
  const Activations& inter() const { return inter_; }

 private:
  void activate_block(int64_t expert, int64_t j0, int64_t j1, int64_t m, Scratch& scratch, int64_t first_row);
  void finish_rows(int64_t expert);

  const KernelSet& kernels_;
  const MoeProblem& p_;
  const Routing& routing_;
  const Activations& x_;
  Activations inter_;
  AlignedBuffer<float> inter_f32_;  // INT8 re-quantizes whole rows after the blocks are done
  ExpertGemm gemm_;
  int64_t width_;
  std::vector<WorkItem> items_;
};

// Phase 3 (w2_combine.cpp): per (expert, block of K), y = a @ W2^T + b2
// times the routing weight, added to its token's fp32 row ([M, K]) in the
// block's turn for the expert.
class W2Combine {
 public:
  W2Combine(const KernelSet& kernels, const MoeProblem& p, const Routing& routing, const Activations& inter);

  // In expert order, blocks inside: taken in order (work_sharing.h's
  // ItemsInOrder), a block's experts come to their turns in that order.
  int64_t items() const { return static_cast<int64_t>(items_.size()); }
  int64_t blocks() const { return blocks_; }
  Scratch scratch() const { return gemm_.scratch(); }
  // false where a wait gave up (another thread failed).
  bool run(int64_t item, Scratch& scratch, RegionOrder& order);
  void check_values() const { gemm_.check_values(); }
  const float* acc() const { return acc_.get(); }

 private:
  const KernelSet& kernels_;
  const MoeProblem& p_;
  const Routing& routing_;
  const Activations& inter_;
  AlignedBuffer<float> acc_;
  ExpertGemm gemm_;
  int64_t width_;
  int64_t blocks_;
  std::vector<WorkItem> items_;
  std::vector<int64_t> turn_;  // each expert's place among the routed ones: its turn in every block
};

// Phase 4 (cast_output.cpp): each token's fp32 row cast once into `out`.
void cast_output(const float* acc, Tensor& out);

}  // namespace moe_xarch
