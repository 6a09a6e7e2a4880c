// The architecture-neutral fused MoE driver: its phases in order, each a
// range named moe_xarch::<phase> in torch.profiler (core/phases.h).
#include "core/fused_experts.h"

#include "core/phase_ranges.h"
#include "core/phases.h"
#include "core/routing.h"

namespace moe_xarch {

Tensor run_fused_experts(const KernelSet& kernels, PackArch arch, const FusedExpertsArgs& args) {
  const MoeProblem p = check_fused_experts_args(args, arch, kernels.tiles);
  Tensor out = args.inplace ? args.hidden_states : torch::stable::empty_like(args.hidden_states);
  if (p.tokens == 0) return out;

  PhaseRanges phases;
  phases.begin("moe_xarch::route");
  const Routing routing = route(p);
  phases.begin("moe_xarch::gather");
  const Activations x = gather(kernels, p, args.hidden_states, routing);
  phases.begin("moe_xarch::w1_activation");
  const Activations inter = w1_activation(kernels, p, routing, x);
  phases.begin("moe_xarch::w2_combine");
  const AlignedBuffer<float> acc = w2_combine(kernels, p, routing, inter);
  phases.begin("moe_xarch::cast_output");
  cast_output(acc.get(), out);
  return out;
}

}  // namespace moe_xarch
