// Sizes computed from user input (shapes, header fields, block sizes). Their
// arithmetic never wraps: a result that does not fit int64 is invalid, and one
// check at the end of an expression covers every step of it.
#pragma once

#include <cstdint>
#include <optional>

namespace moe_xarch {

// ceil(a / b) for a >= 0 and b > 0, without the overflow of (a + b - 1) / b.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// a rounded up to a multiple of b, for sizes known to fit (Size::round_up checks).
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

class Size {
 public:
  constexpr Size(int64_t value) : value_(value), valid_(value >= 0) {}  // NOLINT: sizes read as numbers

  Size operator*(Size other) const {
    Size out = *this;
    out.valid_ = valid_ && other.valid_ && !__builtin_mul_overflow(value_, other.value_, &out.value_);
    return out;
  }
  Size operator+(Size other) const {
    Size out = *this;
    out.valid_ = valid_ && other.valid_ && !__builtin_add_overflow(value_, other.value_, &out.value_);
    return out;
  }
  Size round_up(int64_t multiple) const {
    Size out = Size(ceil_div(value_, multiple)) * multiple;  // round_up, overflow checked
    out.valid_ = out.valid_ && valid_;
    return out;
  }

  std::optional<int64_t> get() const { return valid_ ? std::optional<int64_t>(value_) : std::nullopt; }

 private:
  int64_t value_;
  bool valid_;
};

}  // namespace moe_xarch
