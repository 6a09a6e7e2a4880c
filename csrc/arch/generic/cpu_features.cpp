// Architectures without their own kernels have one level.
#include "core/dispatch.h"

std::vector<moe_kernels::IsaLevel> moe_kernels::isa_ladder() {
  return {{"generic", true, &kernels_generic}};
}
