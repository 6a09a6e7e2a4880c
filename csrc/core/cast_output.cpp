#include <algorithm>

#include "core/phases.h"
#include "core/stable_torch.h"

namespace moe_xarch {

// The output's dtype and values are read once: each read is a call through torch's C shim.
void cast_output(const float* acc, Tensor& out) {
  const int64_t M = out.size(0), K = out.size(1);
  const ScalarType dtype = out.scalar_type();
  void* data = out.mutable_data_ptr();
  parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float* row = acc + m * K;
      switch (dtype) {
        case kFloat: std::copy(row, row + K, static_cast<float*>(data) + m * K); break;
        case kBFloat16: {
          auto* dst = static_cast<c10::BFloat16*>(data) + m * K;
          for (int64_t k = 0; k < K; ++k) dst[k] = c10::BFloat16(row[k]);
          break;
        }
        default: {
          auto* dst = static_cast<c10::Half*>(data) + m * K;
          for (int64_t k = 0; k < K; ++k) dst[k] = c10::Half(row[k]);
          break;
        }
      }
    }
  });
}

}  // namespace moe_xarch
