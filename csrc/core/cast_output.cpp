
#include <algorithm>

#include "core/phases.h"
#include "core/stable_torch.h"

namespace moe_xarch {

void cast_output(const float* acc, Tensor& out) {
  const int64_t M = out.size(0), K = out.size(1);
  parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float* row = acc + m * K;
      switch (out.scalar_type()) {
        case kFloat: std::copy(row, row + K, out.mutable_data_ptr<float>() + m * K); break;
        case kBFloat16: {
          auto* dst = out.mutable_data_ptr<c10::BFloat16>() + m * K;
          for (int64_t k = 0; k < K; ++k) dst[k] = c10::BFloat16(row[k]);
          break;
        }
        default: {
          auto* dst = out.mutable_data_ptr<c10::Half>() + m * K;
          for (int64_t k = 0; k < K; ++k) dst[k] = c10::Half(row[k]);
          break;
        }
      }
    }
  });
}

}  // namespace moe_xarch
