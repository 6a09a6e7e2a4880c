// Everything the library uses of torch, on PyTorch's stable ABI only
// (torch/csrc/stable, torch/headeronly): the build targets the oldest torch
// named in build_support/torch_pin.py (TORCH_TARGET_VERSION) and the same
// library loads on every later release.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>
#include <torch/headeronly/util/HeaderOnlyArrayRef.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace moe_xarch {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using IntArrayRef = torch::headeronly::IntHeaderOnlyArrayRef;

inline constexpr ScalarType kByte = ScalarType::Byte, kChar = ScalarType::Char, kInt = ScalarType::Int,
                            kLong = ScalarType::Long, kHalf = ScalarType::Half, kFloat = ScalarType::Float,
                            kDouble = ScalarType::Double, kBFloat16 = ScalarType::BFloat16,
                            kFloat8_e4m3fn = ScalarType::Float8_e4m3fn, kQUInt4x2 = ScalarType::QUInt4x2,
                            kFloat4_e2m1fn_x2 = ScalarType::Float4_e2m1fn_x2, kUndefined = ScalarType::Undefined;

// Bytes of one value (one byte for the two values of a 4-bit pair).
inline int64_t element_size(ScalarType dtype) {
  switch (dtype) {
#define MOE_XARCH_ELEMENT_SIZE(ctype, name) \
  case ScalarType::name: return static_cast<int64_t>(sizeof(ctype));
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(MOE_XARCH_ELEMENT_SIZE)
#undef MOE_XARCH_ELEMENT_SIZE
    default: throw std::invalid_argument(std::string("no element size for dtype ") + toString(dtype));
  }
}

// A shape, printed as torch prints one: [3, 32].
struct Shape {
  IntArrayRef sizes;
};
inline std::ostream& operator<<(std::ostream& out, Shape shape) {
  out << '[';
  for (size_t i = 0; i < shape.sizes.size(); ++i) out << (i ? ", " : "") << shape.sizes[i];
  return out << ']';
}

inline const char* device_name(const Tensor& t) {
  switch (t.device().type()) {
    case torch::headeronly::DeviceType::CPU: return "cpu";
    case torch::headeronly::DeviceType::CUDA: return "cuda";
    case torch::headeronly::DeviceType::Meta: return "meta";
    case torch::headeronly::DeviceType::XPU: return "xpu";
    case torch::headeronly::DeviceType::MPS: return "mps";
    default: return "another device";
  }
}

template <class... Args>
std::string message(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace moe_xarch

// A violated precondition: a RuntimeError in Python whose message is exactly
// the arguments, which name the argument at fault. One statement (do/while), so
// that an `else` after it cannot attach to its `if`.
#define MOE_XARCH_CHECK(cond, ...)                                                   \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      throw std::runtime_error(::moe_xarch::message(__VA_ARGS__));                   \
  } while (false)

namespace moe_xarch {

inline int64_t num_threads() { return static_cast<int64_t>(torch::stable::get_num_threads()); }

// f(begin, end) over [begin, end) on torch's threads, as at::parallel_for. An
// exception from any chunk reaches the caller as it was thrown: torch's C shim
// would replace it by a generic one.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  std::exception_ptr first;
  std::once_flag caught;
  torch::stable::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
    try {
      f(b, e);
    } catch (...) {
      std::call_once(caught, [&] { first = std::current_exception(); });
    }
  });
  if (first) std::rethrow_exception(first);
}

}  // namespace moe_xarch
