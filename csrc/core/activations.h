// A GEMM's left operand as the driver keeps it: rows in the compute type,
// padded with zeros to kPackAlign values, with per-row scales for int8.
#pragma once

#include <cstdint>

#include "core/buffers.h"
#include "core/kernels.h"
#include "core/problem.h"
#include "core/stable_torch.h"

namespace moe_xarch {

// coverage: unreachable: inlined at every use: gcov counts the out-of-line copy, which nothing calls
inline uint16_t to_bf16_bits(float value) { return c10::BFloat16(value).x; }

struct Activations {
  ComputeType compute;
  QuantizeRowFn quantize_row_s8;
  int64_t ld = 0;
  AlignedBuffer<uint16_t> bf16;
  AlignedBuffer<float> f32;
  AlignedBuffer<int8_t> s8;
  AlignedBuffer<float> scale;

  // `what` names the rows and the arguments their number and width come from.
  Activations(const KernelSet& kernels, ComputeType compute, int64_t rows, int64_t width, const char* what);

  // Stores one fp32 row (width values) at `row`, converting and padding.
  void store_row(int64_t row, const float* values, int64_t width);

  // Row `row` of `from` (same compute type and width) into row `row` here.
  void copy_row(int64_t row, const Activations& from, int64_t from_row);

  // Zeros row `row` past `width`, so that padded operands can run over ld.
  void zero_padding(int64_t row, int64_t width);
};

}  // namespace moe_xarch
