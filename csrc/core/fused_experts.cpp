// The architecture-neutral fused MoE driver: its phases in order, each a
// range in torch.profiler (core/phases.h); the two GEMM phases share one
// parallel region and one range, moe_xarch::experts.
#include "core/fused_experts.h"

#include <algorithm>

#include "core/phase_ranges.h"
#include "core/phases.h"
#include "core/routing.h"
#include "core/work_sharing.h"

namespace moe_xarch {
namespace {

// Phases 2 and 3 in one parallel region (core/phases.h): one fork and join
// per call, and no thread idle at a barrier while others end the first GEMM.
// Each thread takes first-GEMM items until none is left, so every one is
// taken before any thread waits on an expert; then second-GEMM items (an
// expert's block of K each, so that as many threads stream weights as there
// are items, not blocks) in list order (core/region_order.h says why), a
// thread's share of an expert's blocks at a time: its rows of W2 stream as
// one run.
void w1_then_w2(W1Activation& w1, W2Combine& w2) {
  RegionOrder order(w1.items_per_expert(), w2.blocks());
  const int64_t runs = num_threads();
  SharedItems first(w1.items(), runs);
  ItemsInOrder second(w2.items(), std::max<int64_t>(1, w2.blocks() / runs));
  parallel_for(0, runs, 1, [&](int64_t begin, int64_t end) {
    try {
      {
        Scratch scratch = w1.scratch();
        for (int64_t run = begin; run < end; ++run) {
          for (int64_t item; (item = first.next(run)) >= 0;) w1.run(item, scratch, order);
        }
      }
      Scratch scratch = w2.scratch();
      for (;;) {
        const auto [begin_item, end_item] = second.next();
        if (begin_item >= end_item) break;
        for (int64_t item = begin_item; item < end_item; ++item) {
          if (!w2.run(item, scratch, order)) return;
        }
      }
    } catch (...) {
      order.fail();
      throw;
    }
  });
  w1.check_values();
  w2.check_values();
}

}  // namespace

Tensor run_fused_experts(const KernelSet& kernels, PackArch arch, const FusedExpertsArgs& args) {
  const MoeProblem p = check_fused_experts_args(args, arch, kernels.tiles);
  Tensor out = args.inplace ? args.hidden_states : torch::stable::empty_like(args.hidden_states);
  if (p.tokens == 0) return out;

  PhaseRanges phases;
  phases.begin("moe_xarch::route");
  const Routing routing = route(p);
  phases.begin("moe_xarch::gather");
  const Activations x = gather(kernels, p, args.hidden_states, routing);
  phases.begin("moe_xarch::experts");
  W1Activation w1(kernels, p, routing, x);
  W2Combine w2(kernels, p, routing, w1.inter());
  w1_then_w2(w1, w2);
  phases.begin("moe_xarch::cast_output");
  cast_output(w2.acc(), out);
  return out;
}

}  // namespace moe_xarch
