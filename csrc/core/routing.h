// Phase 0: the routed (token, slot) pairs sorted by expert, and the work
// items of the phases that run per expert.
#pragma once

#include <cstdint>
#include <vector>

#include "core/problem.h"

namespace moe_xarch {

// The routed (token, slot) pairs sorted by expert, stable in token order.
struct Routing {
  std::vector<int64_t> expert_begin;  // E + 1 offsets into the sorted slots
  std::vector<int64_t> token;         // token row of each sorted slot
  std::vector<float> weight;

  int64_t slots() const { return static_cast<int64_t>(token.size()); }
  int64_t rows(int64_t expert) const { return expert_begin[expert + 1] - expert_begin[expert]; }
  int64_t routed_experts() const {
    int64_t routed = 0;
    for (size_t e = 0; e + 1 < expert_begin.size(); ++e) routed += expert_begin[e + 1] > expert_begin[e];
    return routed;
  }
};

// A counting sort by expert; then the packed headers of the experts it routes
// to are checked (each is a cache miss, so only those the call reads).
Routing route(const MoeProblem& p);

// One expert's block of columns [begin, begin + block).
struct WorkItem {
  int64_t expert;
  int64_t begin;
};

// The blocks of `width` columns of every expert that has routed rows.
std::vector<WorkItem> work_items(const Routing& routing, int64_t experts, int64_t width, int64_t block);

}  // namespace moe_xarch
