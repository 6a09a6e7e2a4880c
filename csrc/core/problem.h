// A fused_experts_cpu call after its checks (core/checks.cpp): the shapes,
// the method and compute type, and where each expert's weights are.
#pragma once

#include <cstdint>
#include <optional>

#include "core/methods.h"
#include "core/stable_torch.h"

namespace moe_xarch {

enum class Activation { kSiluAndMul, kSwiglu };

// How the GEMMs compute: bf16 dot products, fp32 FMA, or int8 dot products.
enum class ComputeType { kBF16, kF32, kInt8 };

// One of w1 / w2 after checking: where expert e's rows are and how to scale them.
struct WeightOperand {
  const char* name = nullptr;  // "w1" or "w2"
  ScalarType dtype;
  int64_t rows = 0;
  int64_t cols = 0;
  bool packed = false;
  bool tiles = false;  // packed in the running level's tile layout (KernelSet::tiles)
  const Tensor* tensor = nullptr;
  const float* channel_scale = nullptr;  // INT8: [E, rows]
  const float* block_scale = nullptr;    // FP8: [E, ceil(rows/bn), ceil(cols/bk)]
  int64_t scale_rows = 0;
  int64_t scale_cols = 0;                // FP8 blocks, INT4 groups, MXFP4 blocks of a row
  const float* group_scale = nullptr;    // INT4: [E, rows, cols / group]
  const uint8_t* group_zero = nullptr;   // INT4: as group_scale, or null (zero point 8)
  int64_t group = 0;                     // INT4
  const uint8_t* mx_scale = nullptr;     // MXFP4: E8M0 [E, rows, cols / 32]
  const float* bias = nullptr;           // [E, rows], fp32
  Tensor bias_f32;                   // the converted bias that `bias` points into

  // ld: bytes from one row to the next for 4-bit weights (cols is in values), else values.
  const uint8_t* expert_rows(int64_t expert, int64_t* ld, const int32_t** row_sums) const;
  int64_t row_bytes() const;
};

// Everything the driver needs, checked against the spec; owns fp32 copies of
// the small tensors it converts (routing weights, biases).
struct MoeProblem {
  int64_t tokens = 0, hidden = 0, inter = 0, experts = 0, topk = 0;  // M, K, N, E, topk
  Method method = Method::kUnquant;
  ScalarType act_dtype;
  ComputeType compute = ComputeType::kF32;
  Activation activation = Activation::kSiluAndMul;
  float alpha = 0.f;
  std::optional<float> limit;
  int64_t block_n = 0, block_k = 0;
  WeightOperand w1, w2;
  Tensor topk_weights, topk_ids;  // fp32, int64
};

}  // namespace moe_xarch
