// Which x86_64 kernel levels this CPU and OS can run. Compiled without ISA
// flags, so that detection itself runs anywhere.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "arch/x86/kernels_x86.h"
#include "core/dispatch.h"

namespace moe_xarch {
namespace {

// CPUID bits (Intel SDM vol. 2A, table 3-8 / 3-10), named here rather than
// taken from <cpuid.h>, whose names vary between compilers and versions.
constexpr uint32_t kLeaf1EcxFma = 1u << 12;
constexpr uint32_t kLeaf1EcxOsxsave = 1u << 27;
constexpr uint32_t kLeaf1EcxAvx = 1u << 28;
constexpr uint32_t kLeaf1EcxF16c = 1u << 29;
constexpr uint32_t kLeaf7EbxAvx2 = 1u << 5;
constexpr uint32_t kLeaf7EbxAvx512f = 1u << 16;
constexpr uint32_t kLeaf7EbxAvx512dq = 1u << 17;
constexpr uint32_t kLeaf7EbxAvx512bw = 1u << 30;
constexpr uint32_t kLeaf7EbxAvx512vl = 1u << 31;
constexpr uint32_t kLeaf7EcxAvx512vbmi = 1u << 1;
constexpr uint32_t kLeaf7EcxAvx512vnni = 1u << 11;
constexpr uint32_t kLeaf7Sub1EaxAvx512bf16 = 1u << 5;
constexpr uint32_t kLeaf7EdxAmxBf16 = 1u << 22;
constexpr uint32_t kLeaf7EdxAmxTile = 1u << 24;
constexpr uint32_t kLeaf7EdxAmxInt8 = 1u << 25;

// XCR0: the OS saves and restores these register states on context switch.
constexpr uint64_t kXcr0Ymm = 0x6;    // SSE, AVX
constexpr uint64_t kXcr0Zmm = 0xe6;   // + opmask, ZMM_Hi256, Hi16_ZMM
constexpr uint64_t kXcr0Tiles = 0x60000;  // XTILECFG, XTILEDATA

// Linux hands out the 8 KiB of tile state only to a process that asks
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool request_tiles() { return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0; }

// What this CPU and OS offer, each as its levels.def row tests it.
struct Features {
  bool avx2 = false;    // with FMA and F16C
  bool avx512 = false;  // F, DQ, BW, VL and VNNI, with the ZMM state saved
  bool vbmi = false;
  bool avx512_bf16 = false;
  bool tiles = false;  // AMX-BF16, -TILE and -INT8, with the tile state saved
};

bool all(uint32_t reg, uint32_t bits) { return (reg & bits) == bits; }

// xgetbv without -mxsave; only valid once CPUID reports OSXSAVE.
uint64_t xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

Features detect() {
  Features f;
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  if (!all(ecx, kLeaf1EcxOsxsave | kLeaf1EcxAvx)) return f;
  const uint64_t os = xcr0();
  if ((os & kXcr0Ymm) != kXcr0Ymm) return f;
  const bool fma_f16c = all(ecx, kLeaf1EcxFma | kLeaf1EcxF16c);

  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return f;
  const unsigned int max_subleaf = eax;
  f.tiles = all(edx, kLeaf7EdxAmxBf16 | kLeaf7EdxAmxTile | kLeaf7EdxAmxInt8) && (os & kXcr0Tiles) == kXcr0Tiles;
  f.avx2 = fma_f16c && all(ebx, kLeaf7EbxAvx2);
  f.avx512 = (os & kXcr0Zmm) == kXcr0Zmm &&
             all(ebx, kLeaf7EbxAvx512f | kLeaf7EbxAvx512dq | kLeaf7EbxAvx512bw | kLeaf7EbxAvx512vl) &&
             all(ecx, kLeaf7EcxAvx512vnni);
  f.vbmi = all(ecx, kLeaf7EcxAvx512vbmi);
  if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
    f.avx512_bf16 = all(eax, kLeaf7Sub1EaxAvx512bf16);
  }
  return f;
}

}  // namespace

void add_arch_levels(std::vector<IsaLevel>& ladder) {
  const Features f = detect();
#define MOE_LEVEL(level, test, flags, files) \
  ladder.push_back({#level, ladder.back().supported && (test), &level::kernels});
#include "arch/x86/levels.def"
#undef MOE_LEVEL
}

}  // namespace moe_xarch
