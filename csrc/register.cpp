// The one registration of every moe_kernels op, shared by all architectures.
// Schemas and their C++ function types are generated from
// package/moe_kernels/schemas.txt; each op's declaration in moe_kernels.h is
// checked against its schema here, at compile time, on every architecture.
#include <torch/library.h>

#include <type_traits>

#include "moe_kernels.h"
#include "schemas.h"

#define MOE_KERNELS_CHECK_SIGNATURE(op)                                                  \
  static_assert(std::is_same_v<decltype(moe_kernels::op), moe_kernels::schema::op##_type>, \
                #op ": the C++ function registered in the " MOE_KERNELS_ARCH               \
                " build does not match its schema in package/moe_kernels/schemas.txt")

#define MOE_KERNELS_IMPL(m, op) \
  MOE_KERNELS_CHECK_SIGNATURE(op); \
  m.impl(#op, TORCH_FN(moe_kernels::op))

TORCH_LIBRARY(moe_kernels, m) {
  m.def(moe_kernels::schema::fused_experts_cpu_schema);
  m.def(moe_kernels::schema::convert_weight_packed_schema);
  m.def(moe_kernels::schema::packed_nbytes_schema);
  m.def(moe_kernels::schema::isa_schema);
  m.def(moe_kernels::schema::supported_isas_schema);
}

TORCH_LIBRARY_IMPL(moe_kernels, CPU, m) {
  MOE_KERNELS_IMPL(m, fused_experts_cpu);
  MOE_KERNELS_IMPL(m, convert_weight_packed);
}

// Ops without tensor arguments dispatch to no backend, so they take a
// backend-independent kernel.
TORCH_LIBRARY_IMPL(moe_kernels, CompositeExplicitAutograd, m) {
  MOE_KERNELS_IMPL(m, packed_nbytes);
  MOE_KERNELS_IMPL(m, isa);
  MOE_KERNELS_IMPL(m, supported_isas);
}
