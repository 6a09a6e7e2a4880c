// moe_comp_method values of the spec and the weight dtype each expects.
#pragma once

#include <cstdint>

#include "core/stable_torch.h"

namespace moe_xarch {

enum class Method : int64_t { kUnquant = 0, kInt8W8A8 = 1, kFp8W8A16 = 2, kInt4W4A8 = 3, kMxfp4 = 4 };

const char* method_name(int64_t moe_comp_method);

// Fails with a clear error for values outside the spec.
Method check_method(int64_t moe_comp_method);

// The weight dtype a method takes; UNQUANT takes the activations' dtype.
ScalarType weight_dtype(Method method, ScalarType activation_dtype);

// 4-bit weights arrive as uint8, two values a byte; the driver and packed
// headers tell them apart by these one-byte dtypes (kUndefined: not 4-bit).
ScalarType four_bit_dtype(Method method);
bool is_four_bit(ScalarType dtype);

}  // namespace moe_xarch
