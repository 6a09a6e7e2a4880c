// Which kernels ran: calls per kernel kind and per level whose code ran.
//
// A KernelSet may hand out another level's function, so each kernel counts its
// own calls under the level of the translation unit that defines it
// (MOE_XARCH_LEVEL, set next to its ISA flags); code that hands a call to
// another level's function leaves the count to that function.
//
// Always on, as the wheels under test are the wheels shipped: one thread-local
// increment per kernel call (a GEMM block, a row), never per element.
//
// No C++ library headers and nothing inline with external linkage (kernels.h
// says why).
#pragma once

#include <cstdint>

namespace moe_xarch::counting {

// Kind::kGemmF32 and so on, and the names the Python API reports, from one list.
enum class Kind : int {
#define MOE_KERNEL_KIND(kind, name) kind,
#include "core/kernel_kinds.def"
#undef MOE_KERNEL_KIND
};

inline constexpr const char* kKindNames[] = {
#define MOE_KERNEL_KIND(kind, name) name,
#include "core/kernel_kinds.def"
#undef MOE_KERNEL_KIND
};
inline constexpr int kKinds = sizeof(kKindNames) / sizeof(kKindNames[0]);

// Every architecture's levels (isa() names), and "core": the driver's own
// code, compiled for the baseline, which no level selects (packing).
inline constexpr const char* kLevelNames[] = {
    "core",
#define MOE_LEVEL(level, test, flags, files) #level,
#include "generic/levels.def"
#include "arch/x86/levels.def"
#include "arch/arm/levels.def"
#undef MOE_LEVEL
};
inline constexpr int kLevels = sizeof(kLevelNames) / sizeof(kLevelNames[0]);

constexpr bool same_name(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

constexpr int level_index(const char* name) {
  for (int i = 0; i < kLevels; ++i) {
    if (same_name(kLevelNames[i], name)) return i;
  }
  return -1;
}

inline constexpr int kCoreLevel = level_index("core");

void count(Kind kind, int level) noexcept;

// The totals of every thread, past and present, since the library loaded:
// calls[kind * kLevels + level]. Counters only grow; a caller that wants the
// calls of a stretch of work takes the difference of two reads.
void totals(uint64_t (&calls)[kKinds * kLevels]);

}  // namespace moe_xarch::counting

// MOE_KERNEL_USE(kKind): one call of this kernel, by this file's level.
#if defined(MOE_XARCH_LEVEL)
namespace moe_xarch::counting {
namespace {
constexpr int kThisLevel = level_index(MOE_XARCH_LEVEL);
static_assert(kThisLevel >= 0, "MOE_XARCH_LEVEL names no level of counting::kLevelNames");
}  // namespace
}  // namespace moe_xarch::counting
#define MOE_KERNEL_USE(kind) \
  ::moe_xarch::counting::count(::moe_xarch::counting::Kind::kind, ::moe_xarch::counting::kThisLevel)
#else
#define MOE_KERNEL_USE(kind) \
  static_assert(false, "this file counts kernel calls, but its build sets no MOE_XARCH_LEVEL (sources.cmake)")
#endif
