// The one registration of every moe_kernels op, shared by all architectures.
// Schemas and their C++ function types are generated from
// package/moe_kernels/schemas.txt; each op's declaration in moe_kernels.h is
// checked against its schema here, at compile time, on every architecture.
#include <torch/library.h>

#include <type_traits>

#include "moe_kernels.h"
#include "schemas.h"

// Registers `function` as the kernel of `op`, if its type is the one op's schema implies.
#define MOE_KERNELS_IMPL(m, op, function)                                              \
  static_assert(std::is_same_v<decltype(function), moe_kernels::schema::op##_type>,    \
                #op ": the C++ function registered in the " MOE_KERNELS_ARCH           \
                " build does not match its schema in package/moe_kernels/schemas.txt"); \
  m.impl(#op, TORCH_FN(function))

TORCH_LIBRARY(moe_kernels, m) {
  m.def(moe_kernels::schema::fused_experts_cpu_schema);
  m.def(moe_kernels::schema::convert_weight_packed_schema);
  m.def(moe_kernels::schema::packed_nbytes_schema);
  m.def(moe_kernels::schema::isa_schema);
  m.def(moe_kernels::schema::supported_isas_schema);
  m.def(moe_kernels::schema::kernel_use_schema);
}

TORCH_LIBRARY_IMPL(moe_kernels, CPU, m) {
  MOE_KERNELS_IMPL(m, fused_experts_cpu, moe_kernels::fused_experts_cpu);
  MOE_KERNELS_IMPL(m, convert_weight_packed, moe_kernels::convert_weight_packed);
}

// Ops without tensor arguments dispatch to no backend, so they take a
// backend-independent kernel.
TORCH_LIBRARY_IMPL(moe_kernels, CompositeExplicitAutograd, m) {
  MOE_KERNELS_IMPL(m, packed_nbytes, moe_kernels::packed_nbytes);
  MOE_KERNELS_IMPL(m, isa, moe_kernels::isa);
  MOE_KERNELS_IMPL(m, supported_isas, moe_kernels::supported_isas);
  MOE_KERNELS_IMPL(m, kernel_use, moe_kernels::kernel_use);
}
