#include "core/methods.h"

#include <c10/util/Exception.h>

namespace moe_xarch {

const char* method_name(int64_t moe_comp_method) {
  switch (moe_comp_method) {
    case 0: return "UNQUANT";
    case 1: return "INT8_W8A8";
    case 2: return "FP8_W8A16";
    case 3: return "INT4_W4A8";
    case 4: return "MXFP4";
    default: return "unknown";
  }
}

Method check_method(int64_t moe_comp_method) {
  TORCH_CHECK(moe_comp_method >= 0 && moe_comp_method <= 4,
              "moe_comp_method must be one of 0 (UNQUANT), 1 (INT8_W8A8), 2 (FP8_W8A16), "
              "3 (INT4_W4A8), 4 (MXFP4); got ", moe_comp_method);
  TORCH_CHECK(moe_comp_method <= 2, "moe_comp_method ", moe_comp_method, " (",
              method_name(moe_comp_method),
              ") is not implemented yet; this build supports 0 (UNQUANT), 1 (INT8_W8A8) and 2 "
              "(FP8_W8A16)");
  return static_cast<Method>(moe_comp_method);
}

at::ScalarType weight_dtype(Method method, at::ScalarType activation_dtype) {
  switch (method) {
    case Method::kInt8W8A8: return at::kChar;
    case Method::kFp8W8A16: return at::kFloat8_e4m3fn;
    default: return activation_dtype;
  }
}

}  // namespace moe_xarch
