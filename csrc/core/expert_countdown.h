// The one dependency between the two GEMM phases, which share one parallel
// region: the second GEMM reads an expert's intermediate rows only once the
// first has finished them. Threads that finish their first-GEMM items go on to
// second-GEMM work on the experts already done, not to a barrier.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "core/stable_torch.h"

namespace moe_xarch {

class ExpertCountdown {
 public:
  // items[e]: expert e's first-GEMM items; one with none (no rows, or N = 0) is finished from the start.
  explicit ExpertCountdown(const std::vector<int64_t>& items)
      : left_(std::make_unique<std::atomic<int64_t>[]>(items.size())) {
    for (size_t e = 0; e < items.size(); ++e) {
      left_[e].store(items[e] > 0 ? items[e] : kFinished, std::memory_order_relaxed);
      items_ += items[e];
    }
  }

  // After one of expert e's items: the last one's thread runs finish() (the
  // expert's rows), after every other item's writes (acq_rel), before any
  // waiter reads them (release).
  template <class Finish>
  void item_done(int64_t e, const Finish& finish) {
    if (left_[e].fetch_sub(1, std::memory_order_acq_rel) == 1) {
      finish();
      left_[e].store(kFinished, std::memory_order_release);
    }
    ended_.fetch_add(1, std::memory_order_release);
  }

  // A thread stopped on an exception: waiters give up rather than wait for
  // rows that will never be finished.
  void fail() { failed_.store(true, std::memory_order_relaxed); }

  // Until expert e's rows are finished (true) or a thread failed (false). Only
  // called once every first-GEMM item is taken, by threads that wait on
  // nothing, so each wait ends; an expert still unfinished when all items
  // have ended is an error, not a hang.
  bool wait(int64_t e) const {
    for (int spins = 0; !finished(e); ++spins) {
      if (failed_.load(std::memory_order_relaxed)) return false;
      MOE_XARCH_CHECK(ended_.load(std::memory_order_acquire) < items_ || finished(e),
                      "fused_experts_cpu: internal error: expert ", e, " has no first-GEMM item left to finish it");
      // Yield after a while: with more threads than cores, the thread that
      // finishes the expert may need this core.
      if (spins >= kSpinsBeforeYield) std::this_thread::yield();
    }
    return true;
  }

 private:
  static constexpr int64_t kFinished = -1;
  static constexpr int kSpinsBeforeYield = 64;

  bool finished(int64_t e) const { return left_[e].load(std::memory_order_acquire) == kFinished; }

  std::unique_ptr<std::atomic<int64_t>[]> left_;
  int64_t items_ = 0;
  std::atomic<int64_t> ended_{0};
  std::atomic<bool> failed_{false};
};

}  // namespace moe_xarch
