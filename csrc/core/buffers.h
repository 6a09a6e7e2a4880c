// The driver's buffers: 64-byte aligned, sized from user input, and an error
// that names the arguments behind a size too large, never a crash.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/kernels.h"

namespace moe_xarch {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
using AlignedBuffer = std::unique_ptr<T[], AlignedFree>;

// rows x width values of elem_bytes each, kPackAlign-aligned; `what` names the
// arguments their number and width come from, for the error when they do not
// fit int64 or the machine's memory or cannot be allocated.
void* aligned_bytes(int64_t rows, int64_t width, int64_t elem_bytes, const char* what);

template <typename T>
AlignedBuffer<T> aligned_buffer(int64_t rows, int64_t width, const char* what) {
  return AlignedBuffer<T>(static_cast<T*>(aligned_bytes(rows, width, int64_t{sizeof(T)}, what)));
}

}  // namespace moe_xarch
