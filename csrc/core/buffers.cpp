#include "core/buffers.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <new>
#include <optional>
#include <string>

#include <unistd.h>

#include "core/checked.h"
#include "core/scratch.h"
#include "core/stable_torch.h"

namespace moe_xarch {
namespace {

// Bytes of memory this machine has; no one buffer of a call may need more.
int64_t machine_memory_bytes() {
  static const int64_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (Size(pages) * page).get().value_or(INT64_MAX) : INT64_MAX;
  }();
  return bytes;
}

}  // namespace

void* aligned_bytes(int64_t rows, int64_t width, int64_t elem_bytes, const char* what) {
  const std::optional<int64_t> bytes = (Size(std::max<int64_t>(rows, 1)) * width * elem_bytes)
                                           .round_up(kPackAlign).get();
  const int64_t memory = machine_memory_bytes();
  MOE_XARCH_CHECK(bytes && *bytes <= memory, "fused_experts_cpu: ", what, " needs ", rows, " rows of ", width,
                  " values of ", elem_bytes, " bytes (", bytes ? std::to_string(*bytes >> 20) + " MiB" : "over 2^63 bytes",
                  "), more than this machine's ", memory >> 20, " MiB of memory");
  void* data = std::aligned_alloc(kPackAlign, std::max<int64_t>(*bytes, kPackAlign));
  MOE_XARCH_CHECK(data, "fused_experts_cpu: ", what, " needs ", rows, " rows of ", width, " values of ", elem_bytes,
                  " bytes (", *bytes >> 20, " MiB), which could not be allocated");
  return data;
}

namespace {

struct ScratchBuffer {
  AlignedBuffer<uint8_t> data;
  int64_t capacity = 0;
  // The rows thread_prepared_rows last prepared here (a null: none, or the buffer was taken since).
  const void* a = nullptr;
  int64_t m = 0, k = 0;
};

using ThreadBuffers = std::array<ScratchBuffer, static_cast<size_t>(ScratchUse::kInt4Groups) + 1>;

ThreadBuffers& thread_buffers() {
  thread_local ThreadBuffers buffers;
  return buffers;
}

ScratchBuffer& scratch_buffer(ScratchUse use, int64_t bytes) {
  ScratchBuffer& buffer = thread_buffers()[static_cast<size_t>(use)];
  if (buffer.capacity < bytes) {
    buffer.a = nullptr;
    buffer.data.reset(static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(bytes))));
    buffer.capacity = buffer.data ? bytes : 0;
    if (!buffer.data) throw std::bad_alloc();
  }
  return buffer;
}

}  // namespace

uint8_t* thread_scratch(ScratchUse use, int64_t bytes) {
  ScratchBuffer& buffer = scratch_buffer(use, bytes);
  buffer.a = nullptr;
  return buffer.data.get();
}

PreparedRows thread_prepared_rows(ScratchUse use, int64_t bytes, const void* a, int64_t m, int64_t k) {
  ScratchBuffer& buffer = scratch_buffer(use, bytes);
  const bool ready = buffer.a == a && buffer.m == m && buffer.k == k;
  buffer.a = a;
  buffer.m = m;
  buffer.k = k;
  return {buffer.data.get(), ready};
}

void forget_prepared_rows() {
  for (ScratchBuffer& buffer : thread_buffers()) buffer.a = nullptr;
}

}  // namespace moe_xarch
