// The driver's phases as consecutive torch.profiler ranges named
// moe_xarch::<phase>: each ends where the next begins, the last with the
// call. Each range is a call into torch (the stable ABI has no cheaper
// "is a profiler on" test), a few per fused_experts_cpu call.
#pragma once

#include "core/stable_torch.h"

namespace moe_xarch {

class PhaseRanges {
 public:
  PhaseRanges() = default;
  PhaseRanges(const PhaseRanges&) = delete;
  PhaseRanges& operator=(const PhaseRanges&) = delete;
  ~PhaseRanges() { end(); }

  void begin(const char* name) {
    end();
    if (aoti_record_function_start(name, nullptr, nullptr, 0, &range_) != AOTI_TORCH_SUCCESS) range_ = nullptr;
  }

 private:
  void end() {
    if (range_ != nullptr) aoti_record_function_end(range_);
    range_ = nullptr;
  }

  AtenRecordFunctionHandle range_ = nullptr;
};

}  // namespace moe_xarch
