#include <cstring>
#include <vector>

#include "core/phases.h"
#include "core/stable_torch.h"

namespace moe_xarch {
namespace {

// Row `row` of k values of dtype at data, as fp32.
void load_row_f32(const void* data, ScalarType dtype, int64_t k, int64_t row, float* out) {
  switch (dtype) {
    case kFloat: std::memcpy(out, static_cast<const float*>(data) + row * k, k * sizeof(float)); break;
    case kBFloat16: {
      const auto* src = static_cast<const c10::BFloat16*>(data) + row * k;
      for (int64_t i = 0; i < k; ++i) out[i] = static_cast<float>(src[i]);
      break;
    }
    default: {
      const auto* src = static_cast<const c10::Half*>(data) + row * k;
      for (int64_t i = 0; i < k; ++i) out[i] = static_cast<float>(src[i]);
      break;
    }
  }
}

}  // namespace

// Each token is converted (int8: quantized) once, then copied to each of its slots.
Activations gather(const KernelSet& kernels, const MoeProblem& p, const Tensor& hidden_states,
                   const Routing& routing) {
  const int64_t M = p.tokens, K = p.hidden;
  Activations tokens(kernels, p.compute, M, K, "hidden_states in the GEMMs' input type ([M, K])");
  // Read once: each read of a tensor's dtype or values is a call through torch's C shim.
  const void* data = hidden_states.const_data_ptr();
  const ScalarType dtype = hidden_states.scalar_type();
  parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(K);
    for (int64_t m = begin; m < end; ++m) {
      load_row_f32(data, dtype, K, m, row.data());
      tokens.store_row(m, row.data(), K);
    }
  });
  Activations x(kernels, p.compute, routing.slots(), K,
                "the routed copy of hidden_states (a row of K per routed slot: up to M x topk rows)");
  parallel_for(0, routing.slots(), 16, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) x.copy_row(s, tokens, routing.token[s]);
  });
  return x;
}

}  // namespace moe_xarch
