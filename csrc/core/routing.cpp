#include "core/routing.h"

#include "core/packing.h"

namespace moe_xarch {

Routing route(const MoeProblem& p) {
  const int64_t* ids = p.topk_ids.const_data_ptr<int64_t>();
  const float* weights = p.topk_weights.const_data_ptr<float>();
  const int64_t pairs = p.tokens * p.topk;
  Routing r;
  r.expert_begin.assign(p.experts + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    if (ids[i] >= 0) ++r.expert_begin[ids[i] + 1];
  }
  for (int64_t e = 0; e < p.experts; ++e) r.expert_begin[e + 1] += r.expert_begin[e];
  const int64_t slots = r.expert_begin[p.experts];
  r.token.resize(slots);
  r.weight.resize(slots);
  std::vector<int64_t> next(r.expert_begin.begin(), r.expert_begin.end() - 1);
  for (int64_t i = 0; i < pairs; ++i) {
    if (ids[i] < 0) continue;
    const int64_t s = next[ids[i]]++;
    r.token[s] = i / p.topk;
    r.weight[s] = weights[i];
  }
  for (int64_t e = 0; e < p.experts; ++e) {
    if (r.rows(e) == 0) continue;
    if (p.w1.packed) check_packed_expert(*p.w1.tensor, "w1", e);
    if (p.w2.packed) check_packed_expert(*p.w2.tensor, "w2", e);
  }
  return r;
}

std::vector<WorkItem> work_items(const Routing& routing, int64_t experts, int64_t width, int64_t block) {
  std::vector<WorkItem> items;
  for (int64_t e = 0; e < experts; ++e) {
    if (routing.rows(e) == 0) continue;
    for (int64_t j = 0; j < width; j += block) items.push_back({e, j});
  }
  return items;
}

}  // namespace moe_xarch
