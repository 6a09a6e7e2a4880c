#include "core/methods.h"

#include "core/stable_torch.h"

namespace moe_xarch {

const char* method_name(int64_t moe_comp_method) {
  switch (moe_comp_method) {
    case 0: return "UNQUANT";
    case 1: return "INT8_W8A8";
    case 2: return "FP8_W8A16";
    case 3: return "INT4_W4A8";
    case 4: return "MXFP4";
    // coverage: unreachable: method_name is asked only of a method check_method accepted (0 to 4)
    default: return "unknown";
  }
}

Method check_method(int64_t moe_comp_method) {
  MOE_XARCH_CHECK(moe_comp_method >= 0 && moe_comp_method <= 4,
                  "moe_comp_method must be one of 0 (UNQUANT), 1 (INT8_W8A8), 2 (FP8_W8A16), "
                  "3 (INT4_W4A8), 4 (MXFP4); got ", moe_comp_method);
  return static_cast<Method>(moe_comp_method);
}

ScalarType weight_dtype(Method method, ScalarType activation_dtype) {
  switch (method) {
    case Method::kInt8W8A8: return kChar;
    case Method::kFp8W8A16: return kFloat8_e4m3fn;
    case Method::kInt4W4A8:
    case Method::kMxfp4: return kByte;
    default: return activation_dtype;
  }
}

ScalarType four_bit_dtype(Method method) {
  switch (method) {
    case Method::kInt4W4A8: return kQUInt4x2;
    case Method::kMxfp4: return kFloat4_e2m1fn_x2;
    default: return ScalarType::Undefined;
  }
}

bool is_four_bit(ScalarType dtype) { return dtype == kQUInt4x2 || dtype == kFloat4_e2m1fn_x2; }

}  // namespace moe_xarch
