// Argument checks of fused_experts_cpu: every violation in the spec's "Bad
// input" list is a RuntimeError that names the argument and what was expected.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/checked.h"
#include "core/fused_experts.h"
#include "core/stable_torch.h"

namespace moe_xarch {
namespace {

#define MOE_CHECK(cond, ...) MOE_XARCH_CHECK(cond, "fused_experts_cpu: ", __VA_ARGS__)

// A checked contiguous tensor in dtype (a contiguous copy keeps its layout), the
// same one when it has it: each conversion is a call through torch's dispatcher.
Tensor as_dtype(const Tensor& t, ScalarType dtype) {
  return t.scalar_type() == dtype ? t : torch::stable::to(t, dtype);
}

bool is_float_dtype(ScalarType dtype) {
  return dtype == kFloat || dtype == kBFloat16 || dtype == kHalf || dtype == kDouble;
}

void check_shape(const Tensor& t, const char* name, IntArrayRef expected) {
  MOE_CHECK(t.sizes().equals(expected), name, " must have shape ", Shape{expected}, ", got ", Shape{t.sizes()});
}

void check_contiguous(const Tensor& t, const char* name) {
  MOE_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// What every tensor argument needs before its data is read: to be on the CPU
// (the dispatcher sends a call here when any argument is, whatever the others
// are), at an address its values can be read from (torch.frombuffer makes
// views at any byte offset).
void check_tensor(const Tensor& t, const char* name) {
  MOE_CHECK(t.is_cpu(), name, " must be on the CPU, like hidden_states; got a tensor on ", device_name(t));
  const auto address = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  MOE_CHECK(address % t.element_size() == 0, name, " starts at an address ", address % t.element_size(),
            " bytes past a multiple of its ", t.element_size(), "-byte values; pass ", name, ".clone()");
}

void check_tensor(const std::optional<Tensor>& t, const char* name) {
  if (t.has_value()) check_tensor(*t, name);
}

// An fp32 [E, rows] (or block-scale) tensor the driver reads as a raw pointer.
const float* check_scale(const std::optional<Tensor>& scale, const char* name,
                         const char* method, IntArrayRef expected) {
  MOE_CHECK(scale.has_value(), name, " is required for ", method, " (float32 of shape ", Shape{expected},
            ")");
  MOE_CHECK(scale->scalar_type() == kFloat, name, " must be float32, got ", scale->scalar_type());
  check_shape(*scale, name, expected);
  check_contiguous(*scale, name);
  return scale->const_data_ptr<float>();
}

const float* check_bias(const std::optional<Tensor>& bias, const char* name,
                        IntArrayRef expected, Tensor* converted) {
  if (!bias.has_value()) return nullptr;
  MOE_CHECK(is_float_dtype(bias->scalar_type()), name, " must be a floating-point tensor, got ",
            bias->scalar_type());
  check_shape(*bias, name, expected);
  check_contiguous(*bias, name);
  *converted = as_dtype(*bias, kFloat);
  return converted->const_data_ptr<float>();
}

// Fills rows/cols/dtype of w1 or w2 from an unpacked [E, rows, cols] tensor or
// a packed one; returns E.
int64_t describe_weight(const Tensor& w, const char* name, bool is_vnni, PackArch arch, PackLayout tiles,
                        WeightOperand* operand) {
  operand->name = name;
  operand->tensor = &w;
  operand->packed = is_vnni;
  if (is_vnni) {
    const PackedHeader header = check_packed(w, name, arch, tiles);
    operand->tiles = header.layout != static_cast<int32_t>(PackLayout::kRows);
    operand->rows = header.rows;
    operand->cols = header.cols;
    operand->dtype = static_cast<ScalarType>(header.dtype);
    return w.size(0);
  }
  MOE_CHECK(!(w.scalar_type() == kByte && w.dim() == 2), name,
            " looks like the output of convert_weight_packed; pass is_vnni=True");
  MOE_CHECK(w.dim() == 3, name, " must be 3-D [E, rows, cols], got ", w.dim(), "-D");
  check_contiguous(w, name);
  operand->rows = w.size(1);
  operand->cols = w.size(2);
  operand->dtype = w.scalar_type();
  return w.size(0);
}

// A 4-bit weight (uint8, two values a byte): unpacked, its columns count
// bytes; as the driver sees it, values, and the method's 4-bit dtype.
void describe_four_bit(WeightOperand& w, const char* name, ScalarType four_bit, const char* method) {
  if (w.packed) {  // the header holds the dtype, and the row length in bytes
    if (w.dtype == four_bit) w.cols *= 2;
    return;
  }
  MOE_CHECK(w.dtype == kByte, name, " must be uint8 (two 4-bit values a byte) for ", method, ", got ", w.dtype);
  w.dtype = four_bit;
  w.cols *= 2;
}

// INT4_W4A8's scales and zero points of one weight: [E, rows, cols / G] with
// G (the group size) a multiple of 32 that divides cols, `dim` cols' name.
void check_int4_groups(const std::optional<Tensor>& scale, const std::optional<Tensor>& zero,
                       const char* weight, int64_t E, int64_t rows, int64_t cols, const char* dim,
                       const std::optional<std::vector<int64_t>>& block_size, WeightOperand* w) {
  const std::string scale_name = std::string(weight) + "_scale", zero_name = std::string(weight) + "_zero";
  const char* sname = scale_name.c_str();
  MOE_CHECK(scale.has_value(), sname, " is required for INT4_W4A8 (float32 [E, ", rows, ", ", dim,
            " / G], G the group size)");
  MOE_CHECK(scale->scalar_type() == kFloat, sname, " must be float32, got ", scale->scalar_type());
  MOE_CHECK(scale->dim() == 3 && scale->size(0) == E && scale->size(1) == rows && scale->size(2) > 0,
            sname, " must have shape [E, ", rows, ", ", dim, " / G] = [", E, ", ", rows, ", ", dim, " / G], got ",
            Shape{scale->sizes()});
  const int64_t groups = scale->size(2);
  MOE_CHECK(cols % groups == 0, sname, " has ", groups, " groups a row, which do not divide ", dim, " = ", cols,
            " (the group size G = ", dim, " / ", sname, ".shape[-1] must divide ", dim, ")");
  const int64_t group = cols / groups;
  MOE_CHECK(group % 32 == 0, sname, " gives a group size G = ", dim, " / ", groups, " = ", group,
            ", which is not a multiple of 32");
  MOE_CHECK(!block_size.has_value() || *block_size == (std::vector<int64_t>{1, group}), "block_size must be None or [1, G] = [1, ",
            group, "] for INT4_W4A8 (G from ", sname, "), got ", Shape{*block_size});
  check_contiguous(*scale, sname);
  w->group_scale = scale->const_data_ptr<float>();
  w->scale_cols = groups;
  w->group = group;
  if (!zero.has_value()) return;
  const char* zname = zero_name.c_str();
  MOE_CHECK(zero->scalar_type() == kByte, zname, " must be uint8 (zero points in [0, 15]), got ",
            zero->scalar_type());
  check_shape(*zero, zname, scale->sizes());
  check_contiguous(*zero, zname);
  w->group_zero = zero->const_data_ptr<uint8_t>();
}

// MXFP4's E8M0 scales of one weight: uint8 [E, rows, cols / 32]. Their values
// (no 255, NaN) are checked as the driver reads them (ExpertGemm::tile), as are
// INT4's zero points.
void check_mx_scale(const std::optional<Tensor>& scale, const char* weight, int64_t E, int64_t rows,
                    int64_t cols, const char* dim, WeightOperand* w) {
  const std::string scale_name = std::string(weight) + "_scale";
  const char* sname = scale_name.c_str();
  MOE_CHECK(cols % 32 == 0, "MXFP4 needs the reduction dimension of ", weight, " (", dim,
            ") to be a multiple of 32 (its blocks), got ", dim, " = ", cols);
  MOE_CHECK(scale.has_value(), sname, " is required for MXFP4 (uint8 E8M0 scales [E, ", rows, ", ", dim,
            " / 32])");
  MOE_CHECK(scale->scalar_type() == kByte, sname, " must be uint8 (E8M0 scales), got ", scale->scalar_type());
  check_shape(*scale, sname, {E, rows, cols / 32});
  check_contiguous(*scale, sname);
  w->mx_scale = scale->const_data_ptr<uint8_t>();
  w->scale_cols = cols / 32;
}

}  // namespace

MoeProblem check_fused_experts_args(const FusedExpertsArgs& args, PackArch arch, PackLayout tiles) {
  MoeProblem p;
  p.method = check_method(args.moe_comp_method);
  const char* method = method_name(args.moe_comp_method);

  check_tensor(args.hidden_states, "hidden_states");
  check_tensor(args.w1, "w1");
  check_tensor(args.w2, "w2");
  check_tensor(args.topk_weights, "topk_weights");
  check_tensor(args.topk_ids, "topk_ids");
  check_tensor(args.w1_scale, "w1_scale");
  check_tensor(args.w2_scale, "w2_scale");
  check_tensor(args.w1_zero, "w1_zero");
  check_tensor(args.w2_zero, "w2_zero");
  check_tensor(args.w1_bias, "w1_bias");
  check_tensor(args.w2_bias, "w2_bias");

  const Tensor& x = args.hidden_states;
  MOE_CHECK(x.dim() == 2, "hidden_states must be 2-D [M, K], got ", x.dim(), "-D");
  p.act_dtype = x.scalar_type();
  MOE_CHECK(p.act_dtype == kBFloat16 || p.act_dtype == kHalf || p.act_dtype == kFloat,
            "hidden_states must be bfloat16, float16 or float32, got ", p.act_dtype);
  check_contiguous(x, "hidden_states");
  p.tokens = x.size(0);
  p.hidden = x.size(1);
  MOE_CHECK(p.hidden > 0, "hidden_states must have K > 0 columns");

  MOE_CHECK(args.topk_ids.dim() == 2 && args.topk_ids.size(0) == p.tokens,
            "topk_ids must be 2-D [M, topk] with M = ", p.tokens, ", got shape ",
            Shape{args.topk_ids.sizes()});
  MOE_CHECK(args.topk_ids.scalar_type() == kInt || args.topk_ids.scalar_type() == kLong,
            "topk_ids must be int32 or int64, got ", args.topk_ids.scalar_type());
  check_contiguous(args.topk_ids, "topk_ids");
  p.topk = args.topk_ids.size(1);
  MOE_CHECK(p.topk > 0, "topk_ids must have at least one column");
  MOE_CHECK(is_float_dtype(args.topk_weights.scalar_type()),
            "topk_weights must be a floating-point tensor, got ", args.topk_weights.scalar_type());
  check_shape(args.topk_weights, "topk_weights", args.topk_ids.sizes());
  check_contiguous(args.topk_weights, "topk_weights");

  MOE_CHECK(!args.limit.has_value() || args.alpha.has_value(),
            "limit is only defined for the swiglu activation; pass alpha as well (limit without "
            "alpha is refused rather than silently ignored)");
  p.activation = args.alpha.has_value() ? Activation::kSwiglu : Activation::kSiluAndMul;
  p.alpha = static_cast<float>(args.alpha.value_or(0.0));
  // In float32, as the kernels use them: an infinite alpha gives 0 * inf at gate 0.
  MOE_CHECK(std::isfinite(p.alpha), "alpha must be a finite float32 number, got ", args.alpha.value_or(0.0));
  if (args.limit.has_value()) {
    p.limit = static_cast<float>(*args.limit);
    MOE_CHECK(*p.limit > 0.f, "limit must be a positive number (the clamp bound; +inf clamps nothing), got ",
              *args.limit);
  }
  if (p.method != Method::kInt4W4A8) {
    MOE_CHECK(!args.w1_zero.has_value(), "w1_zero is only used by INT4_W4A8, not ", method);
    MOE_CHECK(!args.w2_zero.has_value(), "w2_zero is only used by INT4_W4A8, not ", method);
  }

  const int64_t e1 = describe_weight(args.w1, "w1", args.is_vnni, arch, tiles, &p.w1);
  const int64_t e2 = describe_weight(args.w2, "w2", args.is_vnni, arch, tiles, &p.w2);
  const ScalarType four_bit = four_bit_dtype(p.method);
  if (four_bit != ScalarType::Undefined) {
    describe_four_bit(p.w1, "w1", four_bit, method);
    describe_four_bit(p.w2, "w2", four_bit, method);
    MOE_CHECK(p.hidden % 2 == 0, "hidden_states must have an even K for ", method,
              " (two 4-bit values a byte), got K = ", p.hidden);
  }
  const ScalarType wdtype = four_bit != ScalarType::Undefined ? four_bit : weight_dtype(p.method, p.act_dtype);
  MOE_CHECK(p.w1.dtype == wdtype, "w1 must be ", wdtype, " for ", method, " with ", p.act_dtype,
            " hidden_states, got ", p.w1.dtype);
  MOE_CHECK(p.w2.dtype == wdtype, "w2 must be ", wdtype, " for ", method, " with ", p.act_dtype,
            " hidden_states, got ", p.w2.dtype);
  p.experts = e1;
  MOE_CHECK(e1 > 0, "w1 must hold at least one expert");
  MOE_CHECK(e2 == e1, "w2 has ", e2, " experts but w1 has ", e1);
  MOE_CHECK(p.w1.cols == p.hidden, "w1 must be [E, 2N, K] with K = ", p.hidden,
            " (hidden_states' columns), got K = ", p.w1.cols);
  MOE_CHECK(p.w1.rows % 2 == 0, "w1 must be [E, 2N, K] with an even number of rows, got ",
            p.w1.rows);
  p.inter = p.w1.rows / 2;
  MOE_CHECK(four_bit == ScalarType::Undefined || p.inter % 2 == 0, "w1 must be [E, 2N, K / 2] with an even N for ",
            method, " (w2 holds two 4-bit values of N a byte), got N = ", p.inter);
  MOE_CHECK(p.w2.rows == p.hidden && p.w2.cols == p.inter, "w2 must be [E, K, N] = [", e1, ", ",
            p.hidden, ", ", p.inter, "] to match w1 and hidden_states, got [", e2, ", ", p.w2.rows,
            ", ", p.w2.cols, "]");

  const int64_t E = p.experts, K = p.hidden, N = p.inter;
  if (p.method == Method::kUnquant) {
    MOE_CHECK(!args.w1_scale.has_value() && !args.w2_scale.has_value(),
              "w1_scale / w2_scale are not used by UNQUANT; pass None");
  } else if (p.method == Method::kInt8W8A8) {
    p.w1.channel_scale = check_scale(args.w1_scale, "w1_scale", method, {E, 2 * N});
    p.w2.channel_scale = check_scale(args.w2_scale, "w2_scale", method, {E, K});
  } else if (p.method == Method::kInt4W4A8) {
    check_int4_groups(args.w1_scale, args.w1_zero, "w1", E, 2 * N, K, "K", args.block_size, &p.w1);
    check_int4_groups(args.w2_scale, args.w2_zero, "w2", E, K, N, "N", args.block_size, &p.w2);
  } else if (p.method == Method::kMxfp4) {
    MOE_CHECK(!args.block_size.has_value() || *args.block_size == (std::vector<int64_t>{1, 32}),
              "block_size must be None or [1, 32] for MXFP4 (blocks of 32 along the reduction dimension), got ",
              Shape{*args.block_size});
    check_mx_scale(args.w1_scale, "w1", E, 2 * N, K, "K", &p.w1);
    check_mx_scale(args.w2_scale, "w2", E, K, N, "N", &p.w2);
  } else {
    MOE_CHECK(args.block_size.has_value() && args.block_size->size() == 2,
              "block_size = [bn, bk] is required for FP8_W8A16");
    p.block_n = (*args.block_size)[0];
    p.block_k = (*args.block_size)[1];
    MOE_CHECK(p.block_n > 0 && p.block_k > 0, "block_size must be two positive values, got ",
              Shape{*args.block_size});
    // A block past the dimension it blocks is one block of it; clamped so that
    // the kernels' block arithmetic stays far from overflow.
    p.block_n = std::min(p.block_n, std::max(2 * N, K));
    p.block_k = std::min(p.block_k, std::max(K, N));
    p.w1.scale_rows = ceil_div(2 * N, p.block_n);
    p.w1.scale_cols = ceil_div(K, p.block_k);
    p.w2.scale_rows = ceil_div(K, p.block_n);
    p.w2.scale_cols = ceil_div(N, p.block_k);
    p.w1.block_scale = check_scale(args.w1_scale, "w1_scale", method,
                                   {E, p.w1.scale_rows, p.w1.scale_cols});
    p.w2.block_scale = check_scale(args.w2_scale, "w2_scale", method,
                                   {E, p.w2.scale_rows, p.w2.scale_cols});
  }
  p.w1.bias = check_bias(args.w1_bias, "w1_bias", {E, 2 * N}, &p.w1.bias_f32);
  p.w2.bias = check_bias(args.w2_bias, "w2_bias", {E, K}, &p.w2.bias_f32);

  p.topk_ids = as_dtype(args.topk_ids, kLong);
  p.topk_weights = as_dtype(args.topk_weights, kFloat);
  if (p.topk_ids.numel() > 0) {
    const int64_t* ids = p.topk_ids.const_data_ptr<int64_t>();
    const int64_t max_id = *std::max_element(ids, ids + p.topk_ids.numel());
    MOE_CHECK(max_id < E, "topk_ids must be in [0, E) = [0, ", E, ") (negative marks an unused slot), got ",
              max_id);
  }

  if (p.method == Method::kInt8W8A8 || p.method == Method::kInt4W4A8) {
    p.compute = ComputeType::kInt8;
  } else if (p.act_dtype == kBFloat16) {
    p.compute = ComputeType::kBF16;
  } else {
    p.compute = ComputeType::kF32;
  }
  return p;
}

}  // namespace moe_xarch
