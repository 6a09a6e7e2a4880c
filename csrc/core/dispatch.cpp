#include "core/dispatch.h"

#include <cstdlib>
#include <string>

#include "core/stable_torch.h"
#include "moe_xarch.h"

namespace moe_xarch {
namespace {

// The levels, lowest first: generic, then the architecture's. Built once, as
// amx's test asks the OS for tile state.
const std::vector<IsaLevel>& isa_ladder() {
  static const std::vector<IsaLevel> ladder = [] {
    std::vector<IsaLevel> levels;
#define MOE_LEVEL(level, test, flags, files) levels.push_back({#level, test, &level::kernels});
#include "generic/levels.def"
#undef MOE_LEVEL
    add_arch_levels(levels);
    return levels;
  }();
  return ladder;
}

std::vector<std::string> level_list(bool supported_only) {
  std::vector<std::string> names;
  for (const IsaLevel& level : isa_ladder()) {
    if (!supported_only || level.supported) names.emplace_back(level.name);
  }
  return names;
}

std::string level_names(bool supported_only) {
  std::string names;
  for (const std::string& name : level_list(supported_only)) names += (names.empty() ? "" : ", ") + name;
  return names;
}

struct Selected {
  const char* name;
  const KernelSet* kernels;
};

Selected select_level() {
  const std::vector<IsaLevel>& ladder = isa_ladder();
  const char* forced = std::getenv("MOE_XARCH_ISA");
  if (forced == nullptr || *forced == '\0') {
    const IsaLevel* best = nullptr;  // "generic" is always supported
    // coverage: begin unreachable on x86_64: the default (best) level: every x86 run forces its level with
    //   MOE_XARCH_ISA
    for (const IsaLevel& level : ladder) {
      if (level.supported) best = &level;
    }
    return {best->name, &best->kernels()};
    // coverage: end
  }
  for (const IsaLevel& level : ladder) {
    if (std::string(level.name) != forced) continue;
    MOE_XARCH_CHECK(level.supported, "MOE_XARCH_ISA=", forced,
                    " is not supported by this CPU; it supports: ", level_names(true));
    return {level.name, &level.kernels()};
  }
  MOE_XARCH_CHECK(false, "MOE_XARCH_ISA=", forced,
                  " names no kernel path of this architecture; choose one of: ",
                  level_names(false));
}

const Selected& selected_level() {
  // A throwing initializer is retried on the next call, so the error repeats.
  static const Selected selected = select_level();
  return selected;
}

}  // namespace

const KernelSet& active_kernels() { return *selected_level().kernels; }

std::string isa() { return selected_level().name; }

std::vector<std::string> supported_isas() { return level_list(true); }

std::vector<std::string> isa_levels() { return level_list(false); }

}  // namespace moe_xarch
