// Architectures without their own kernels have one level.
#include "core/dispatch.h"

std::vector<moe_xarch::IsaLevel> moe_xarch::isa_ladder() {
  return {{"generic", true, &generic::kernels}};
}
