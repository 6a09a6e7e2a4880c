// What orders the work of the one parallel region that runs both GEMMs
// (core/fused_experts.cpp), so that threads never meet at a barrier:
// - the second GEMM reads an expert's intermediate rows only once the first
//   has finished them: a thread done with its first-GEMM items goes on to
//   second-GEMM items of the experts already finished;
// - each block of output columns adds its experts in one fixed order (their
//   turns), whichever threads run them: the same bytes at every thread count.
// Waits only ever wait on work a running thread has taken (the driver takes
// every first-GEMM item before any second-GEMM one, and second-GEMM items in
// order), so each wait ends.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "core/stable_torch.h"

namespace moe_xarch {

class RegionOrder {
 public:
  // items[e]: expert e's first-GEMM items; one with none (no rows, or N = 0)
  // is finished from the start. blocks: the second GEMM's blocks of columns.
  RegionOrder(const std::vector<int64_t>& items, int64_t blocks)
      : left_(std::make_unique<std::atomic<int64_t>[]>(items.size())),
        turn_(std::make_unique<Turn[]>(blocks)) {
    for (size_t e = 0; e < items.size(); ++e) {
      left_[e].store(items[e] > 0 ? items[e] : kFinished, std::memory_order_relaxed);
      items_ += items[e];
    }
    for (int64_t b = 0; b < blocks; ++b) turn_[b].store(0, std::memory_order_relaxed);
  }

  // After one of expert e's first-GEMM items: the last one's thread runs
  // finish() (the expert's rows), after every other item's writes (acq_rel),
  // before any waiter reads them (release).
  template <class Finish>
  void item_done(int64_t e, const Finish& finish) {
    if (left_[e].fetch_sub(1, std::memory_order_acq_rel) == 1) {
      finish();
      left_[e].store(kFinished, std::memory_order_release);
    }
    ended_.fetch_add(1, std::memory_order_release);
  }

  // Until expert e's rows are finished (true) or a thread failed (false). An
  // expert still unfinished when every first-GEMM item has ended is an
  // error, not a hang.
  bool wait_finished(int64_t e) const {
    return wait([&] { return finished(e); }, [&] {
      MOE_XARCH_CHECK(ended_.load(std::memory_order_acquire) < items_ || finished(e),
                      "fused_experts_cpu: internal error: expert ", e, " has no first-GEMM item left to finish it");
    });
  }

  // Until block `block` takes its `turn`-th expert (true) or a thread failed
  // (false); the item before it in the block's order is taken and adds first.
  bool wait_turn(int64_t block, int64_t turn) const {
    return wait([&] { return turn_[block].load(std::memory_order_acquire) == turn; }, [] {});
  }
  void pass_turn(int64_t block) { turn_[block].fetch_add(1, std::memory_order_release); }

  // A thread stopped on an exception: waiters give up rather than wait for
  // work that will never end.
  void fail() { failed_.store(true, std::memory_order_relaxed); }

 private:
  static constexpr int64_t kFinished = -1;
  static constexpr int kSpinsBeforeYield = 64;

  bool finished(int64_t e) const { return left_[e].load(std::memory_order_acquire) == kFinished; }

  template <class Done, class Check>
  bool wait(const Done& done, const Check& check) const {
    for (int spins = 0; !done(); ++spins) {
      if (failed_.load(std::memory_order_relaxed)) return false;
      check();
      // Yield after a while: with more threads than cores, the thread being
      // waited for may need this core.
      if (spins >= kSpinsBeforeYield) std::this_thread::yield();
    }
    return true;
  }

  struct alignas(64) Turn : std::atomic<int64_t> {};  // a line each: blocks' turns pass on different threads

  std::unique_ptr<std::atomic<int64_t>[]> left_;
  std::unique_ptr<Turn[]> turn_;
  int64_t items_ = 0;
  std::atomic<int64_t> ended_{0};
  std::atomic<bool> failed_{false};
};

}  // namespace moe_xarch
