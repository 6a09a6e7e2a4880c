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

// As thread_scratch, for what a kernel prepares from rows of a (panels, rows
// put in another order) at the buffer's start: `ready` when this thread last
// prepared the same rows (a, m rows, k values) there in its share of the
// phase, and no kernel took the buffer since. The driver calls the kernel once
// per work item (and for gate, then up), each time with the same rows for
// other columns of b; within a phase the rows do not change, and the same rows
// meet the same kernel. A thread starts its share of a phase with
// forget_prepared_rows(): rows of an earlier phase or call may lie at the same
// address.
struct PreparedRows {
  uint8_t* data;
  bool ready;
};
PreparedRows thread_prepared_rows(ScratchUse use, int64_t bytes, const void* a, int64_t m, int64_t k);
void forget_prepared_rows();

}  // namespace moe_xarch
