// Per-thread scratch for kernels (core/buffers.cpp). Included by files compiled
// with ISA flags: no C++ library headers (core/kernels.h says why).
#pragma once

#include <cstdint>

namespace moe_xarch {

// This thread's scratch for one use, at least `bytes` of it, 64-byte aligned
// and kept for its next call; each use has its own buffer, so a kernel may
// hold one while a kernel it calls takes another.
enum class ScratchUse { kPanels, kRowsOfA, kFp8Block, kInt4Groups };
uint8_t* thread_scratch(ScratchUse use, int64_t bytes);

}  // namespace moe_xarch
