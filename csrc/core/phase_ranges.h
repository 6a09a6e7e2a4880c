// The driver's phases as consecutive torch.profiler ranges named
// moe_xarch::<phase>: each ends where the next begins, the last with the
// call. Costs a thread-local check when no profiler is on.
#pragma once

#include <ATen/record_function.h>

#include <optional>

namespace moe_xarch {

class PhaseRanges {
 public:
  void begin(const char* name) {
    range_.reset();
    range_.emplace(at::RecordScope::FUNCTION);
    if (range_->isActive()) range_->before(name);
  }

 private:
  std::optional<at::RecordFunction> range_;
};

}  // namespace moe_xarch
