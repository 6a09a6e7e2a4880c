// Independent work items shared by the threads of one parallel region, and
// how wide a phase makes them.
//
// Each thread owns a contiguous run of items and takes them front to back,
// so the weights it reads stream as one run; a thread whose run is done takes
// the last items left in the others' runs: threads share memory bandwidth
// unevenly, so equal runs alone leave the first thread done waiting.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "core/stable_torch.h"

namespace moe_xarch {

class SharedItems {
 public:
  SharedItems(int64_t items, int64_t runs) : runs_(runs), bounds_(std::make_unique<Bounds[]>(runs)) {
    for (int64_t r = 0; r < runs; ++r) bounds_[r].store(pack(items * r / runs, items * (r + 1) / runs));
  }

  // The next item for the owner of `run`, or -1 when no run has any left.
  int64_t next(int64_t run) {
    if (const int64_t item = take(run, /*front=*/true); item >= 0) return item;
    for (int64_t other = 1; other < runs_; ++other) {
      if (const int64_t item = take((run + other) % runs_, /*front=*/false); item >= 0) return item;
    }
    return -1;
  }

 private:
  // A run's [front, back), both in one word so that taking from either end is one exchange.
  struct alignas(64) Bounds : std::atomic<uint64_t> {};

  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(back);
  }

  int64_t take(int64_t run, bool front) {
    Bounds& bounds = bounds_[run];
    uint64_t seen = bounds.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t first = static_cast<int64_t>(seen >> 32), last = static_cast<int64_t>(seen & 0xffffffffu);
      if (first >= last) return -1;
      const uint64_t after = front ? pack(first + 1, last) : pack(first, last - 1);
      if (bounds.compare_exchange_weak(seen, after, std::memory_order_relaxed)) return front ? first : last - 1;
    }
  }

  int64_t runs_;
  std::unique_ptr<Bounds[]> bounds_;
};

// Items taken strictly in order, `run` consecutive ones at a time, each run
// by the next thread to ask: where an item waits on earlier ones, those are
// then taken, by running threads, or by this one before it.
class ItemsInOrder {
 public:
  ItemsInOrder(int64_t items, int64_t run) : items_(items), run_(run) {}

  // The next run's items [first, last); first >= last when none is left.
  std::pair<int64_t, int64_t> next() {
    const int64_t first = next_.fetch_add(run_, std::memory_order_relaxed);
    return {first, std::min(items_, first + run_)};
  }

 private:
  int64_t items_;
  int64_t run_;
  alignas(64) std::atomic<int64_t> next_{0};
};

// Work items a thread should have to choose from: with fewer, the threads
// whose share of memory bandwidth is short hold the others up at the end.
constexpr int64_t kItemsPerThread = 4;
// Columns an item never goes below: avx512_bf16's line kernels take 64
// columns at a time, then 32, then 16, each step with its own order of sums,
// so a narrower item would change a column's value with the thread count.
constexpr int64_t kNarrowestItem = 64;

// A phase's item width: `widest` columns (a power of two from kNarrowestItem),
// halved while items_of(width), the items it gives, number fewer than
// kItemsPerThread a thread: in decode an expert's few blocks would leave most
// of 16 or more threads idle.
template <class ItemsOf>
int64_t item_width(int64_t widest, ItemsOf items_of) {
  const int64_t wanted = kItemsPerThread * num_threads();
  int64_t width = widest;
  while (width > kNarrowestItem && items_of(width) < wanted) width /= 2;
  return width;
}

}  // namespace moe_xarch
