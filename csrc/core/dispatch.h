// Run-time choice of the kernel path by CPU feature.
#pragma once

#include <vector>

#include "core/kernels.h"

namespace moe_xarch {

struct IsaLevel {
  const char* name;
  bool supported;  // this CPU can run it
  // Called only for a supported level: a level's code, its initializers
  // included, is compiled with its ISA flags and may fault on an older CPU.
  const KernelSet& (*kernels)();
};

// Appends the architecture's levels above generic (its levels.def) to a
// ladder that holds generic: csrc/arch/<arch>/cpu_features.cpp, compiled
// without ISA flags so that detection itself never faults on an older CPU.
void add_arch_levels(std::vector<IsaLevel>& ladder);

// The highest supported level, or the one MOE_XARCH_ISA names (an unknown or
// unsupported name is an error that lists the valid ones).
const KernelSet& active_kernels();

}  // namespace moe_xarch
