#include "core/kernel_use.h"

#include <mutex>
#include <string>
#include <vector>

#include "moe_xarch.h"

namespace moe_xarch::counting {
namespace {

// One thread's counters. Only their thread writes them, with relaxed atomic
// loads and stores (plain moves, no locked instructions); a reader on
// another thread sums them under the registry's mutex.
struct Counters {
  uint64_t calls[kKinds * kLevels] = {};

  Counters();
  ~Counters();
};

struct Registry {
  std::mutex mutex;
  std::vector<Counters*> live;
  uint64_t ended[kKinds * kLevels] = {};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may end after static destruction began
  return *r;
}

uint64_t load(const uint64_t& value) { return __atomic_load_n(&value, __ATOMIC_RELAXED); }

Counters::Counters() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.live.push_back(this);
}

Counters::~Counters() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  for (int i = 0; i < kKinds * kLevels; ++i) r.ended[i] += calls[i];
  std::erase(r.live, this);
}

}  // namespace

void count(Kind kind, int level) noexcept {
  thread_local Counters counters;
  uint64_t& calls = counters.calls[static_cast<int>(kind) * kLevels + level];
  __atomic_store_n(&calls, load(calls) + 1, __ATOMIC_RELAXED);
}

void totals(uint64_t (&calls)[kKinds * kLevels]) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  for (int i = 0; i < kKinds * kLevels; ++i) {
    calls[i] = r.ended[i];
    for (const Counters* counters : r.live) calls[i] += load(counters->calls[i]);
  }
}

}  // namespace moe_xarch::counting

// {"kind": {"level": calls}}, the kinds and levels that ran; names are plain
// identifiers, so nothing needs escaping.
std::string moe_xarch::kernel_use() {
  uint64_t calls[counting::kKinds * counting::kLevels];
  counting::totals(calls);
  std::string json = "{";
  for (int kind = 0; kind < counting::kKinds; ++kind) {
    std::string levels;
    for (int level = 0; level < counting::kLevels; ++level) {
      const uint64_t n = calls[kind * counting::kLevels + level];
      if (n == 0) continue;
      levels += levels.empty() ? "" : ", ";
      levels += std::string("\"") + counting::kLevelNames[level] + "\": " + std::to_string(n);
    }
    if (levels.empty()) continue;
    json += json.size() > 1 ? ", " : "";
    json += std::string("\"") + counting::kKindNames[kind] + "\": {" + levels + "}";
  }
  return json + "}";
}
