// The one registration of every moe_xarch op, for all architectures; each
// op's declaration in moe_xarch.h is checked at compile time against its
// schema (schemas.h, generated from package/moe_xarch/schemas.txt).
#include <torch/csrc/stable/library.h>

#include <type_traits>

#include "moe_xarch.h"
#include "schemas.h"

// Registers `function` as the kernel of `op`, if its type is the one op's schema implies.
#define MOE_XARCH_IMPL(m, op, function)                                              \
  static_assert(std::is_same_v<decltype(function), moe_xarch::schema::op##_type>,    \
                #op ": the C++ function registered in the " MOE_XARCH_ARCH           \
                " build does not match its schema in package/moe_xarch/schemas.txt"); \
  m.impl(#op, TORCH_BOX(&function))

STABLE_TORCH_LIBRARY(moe_xarch, m) {
  m.def(moe_xarch::schema::fused_experts_cpu_schema);
  m.def(moe_xarch::schema::convert_weight_packed_schema);
  m.def(moe_xarch::schema::packed_nbytes_schema);
  m.def(moe_xarch::schema::isa_schema);
  m.def(moe_xarch::schema::supported_isas_schema);
  m.def(moe_xarch::schema::isa_levels_schema);
  m.def(moe_xarch::schema::kernel_use_schema);
}

STABLE_TORCH_LIBRARY_IMPL(moe_xarch, CPU, m) {
  MOE_XARCH_IMPL(m, fused_experts_cpu, moe_xarch::fused_experts_cpu);
  MOE_XARCH_IMPL(m, convert_weight_packed, moe_xarch::convert_weight_packed);
}

// Ops without tensor arguments dispatch to no backend, so they take a
// backend-independent kernel.
STABLE_TORCH_LIBRARY_IMPL(moe_xarch, CompositeExplicitAutograd, m) {
  MOE_XARCH_IMPL(m, packed_nbytes, moe_xarch::packed_nbytes);
  MOE_XARCH_IMPL(m, isa, moe_xarch::isa);
  MOE_XARCH_IMPL(m, supported_isas, moe_xarch::supported_isas);
  MOE_XARCH_IMPL(m, isa_levels, moe_xarch::isa_levels);
  MOE_XARCH_IMPL(m, kernel_use, moe_xarch::kernel_use);
}
