// The one registration of every moe_kernels op, shared by all architectures.
// Schemas come from package/moe_kernels/schemas.txt (generated/schemas.h);
// torch checks each C++ signature against its schema when the library loads.
#include <torch/library.h>

#include "moe_kernels.h"
#include "schemas.h"

TORCH_LIBRARY(moe_kernels, m) {
  for (const char* schema : moe_kernels::kSchemas) m.def(schema);
}

TORCH_LIBRARY_IMPL(moe_kernels, CPU, m) {
  m.impl("fused_experts_cpu", TORCH_FN(moe_kernels::fused_experts_cpu));
  m.impl("convert_weight_packed", TORCH_FN(moe_kernels::convert_weight_packed));
}

// Ops without tensor arguments dispatch to no backend, so they take a
// backend-independent kernel.
TORCH_LIBRARY_IMPL(moe_kernels, CompositeExplicitAutograd, m) {
  m.impl("packed_nbytes", TORCH_FN(moe_kernels::packed_nbytes));
  m.impl("isa", TORCH_FN(moe_kernels::isa));
  m.impl("supported_isas", TORCH_FN(moe_kernels::supported_isas));
}
