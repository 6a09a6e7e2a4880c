// Which aarch64 kernel levels this CPU runs. Compiled without ISA flags, so
// that detection itself runs on any aarch64 CPU; the kernels it hands out are
// only called when the kernel's HWCAP bits are present.
#include <vector>

#if defined(__linux__)
#include <sys/auxv.h>
#endif

#include "arch/arm/kernels_arm.h"
#include "core/dispatch.h"

// The Linux uapi values, for C libraries whose headers predate them.
#ifndef AT_HWCAP
#define AT_HWCAP 16
#endif
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1UL << 14)
#endif

namespace moe_xarch {
namespace {

struct ArmFeatures {
  bool asimd = false;
  bool asimddp = false;
  bool i8mm = false;
  bool bf16 = false;
};

ArmFeatures detect() {
  ArmFeatures f;
#if defined(__linux__)
  const unsigned long hwcap = getauxval(AT_HWCAP);
  const unsigned long hwcap2 = getauxval(AT_HWCAP2);
  f.asimd = (hwcap & HWCAP_ASIMD) != 0;
  f.asimddp = (hwcap & HWCAP_ASIMDDP) != 0;
  f.i8mm = (hwcap2 & HWCAP2_I8MM) != 0;
  f.bf16 = (hwcap2 & HWCAP2_BF16) != 0;
#else
  // Advanced SIMD is part of the aarch64 baseline; claim nothing beyond it.
  f.asimd = true;
#endif
  return f;
}

}  // namespace

void add_arch_levels(std::vector<IsaLevel>& ladder) {
  const ArmFeatures f = detect();
#define MOE_LEVEL(level, test, flags, files) \
  ladder.push_back({#level, ladder.back().supported && (test), &level::kernels});
#include "arch/arm/levels.def"
#undef MOE_LEVEL
}

}  // namespace moe_xarch
