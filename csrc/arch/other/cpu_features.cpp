// Architectures without kernels of their own have no level above generic.
#include "core/dispatch.h"

void moe_xarch::add_arch_levels(std::vector<IsaLevel>&) {}
