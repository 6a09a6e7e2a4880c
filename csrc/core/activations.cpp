#include "core/activations.h"

#include <algorithm>
#include <cstring>

#include "core/checked.h"

namespace moe_xarch {

Activations::Activations(const KernelSet& kernels, ComputeType compute, int64_t rows, int64_t width,
                         const char* what)
    : compute(compute), quantize_row_s8(kernels.quantize_row_s8), ld(round_up(width, kPackAlign)) {
  switch (compute) {
    case ComputeType::kBF16: bf16 = aligned_buffer<uint16_t>(rows, ld, what); break;
    case ComputeType::kF32: f32 = aligned_buffer<float>(rows, ld, what); break;
    case ComputeType::kInt8:
      s8 = aligned_buffer<int8_t>(rows, ld, what);
      scale = aligned_buffer<float>(rows, 1, what);
      break;
  }
}

void Activations::store_row(int64_t row, const float* values, int64_t width) {
  switch (compute) {
    case ComputeType::kBF16: {
      uint16_t* dst = bf16.get() + row * ld;
      for (int64_t i = 0; i < width; ++i) dst[i] = to_bf16_bits(values[i]);
      std::fill(dst + width, dst + ld, uint16_t{0});
      break;
    }
    case ComputeType::kF32: {
      float* dst = f32.get() + row * ld;
      std::copy(values, values + width, dst);
      std::fill(dst + width, dst + ld, 0.f);
      break;
    }
    case ComputeType::kInt8: {
      int8_t* dst = s8.get() + row * ld;
      quantize_row_s8(width, values, dst, scale.get() + row);
      std::fill(dst + width, dst + ld, int8_t{0});
      break;
    }
  }
}

void Activations::copy_row(int64_t row, const Activations& from, int64_t from_row) {
  switch (compute) {
    case ComputeType::kBF16: std::memcpy(&bf16[row * ld], &from.bf16[from_row * ld], ld * sizeof(uint16_t)); break;
    case ComputeType::kF32: std::memcpy(&f32[row * ld], &from.f32[from_row * ld], ld * sizeof(float)); break;
    case ComputeType::kInt8:
      std::memcpy(&s8[row * ld], &from.s8[from_row * ld], ld);
      scale[row] = from.scale[from_row];
      break;
  }
}

void Activations::zero_padding(int64_t row, int64_t width) {
  switch (compute) {
    case ComputeType::kBF16: std::fill(bf16.get() + row * ld + width, bf16.get() + (row + 1) * ld, uint16_t{0}); break;
    case ComputeType::kF32: std::fill(f32.get() + row * ld + width, f32.get() + (row + 1) * ld, 0.f); break;
    // coverage: unreachable: zero_padding is called for bf16 and fp32 intermediates only (w1_activation.cpp):
    //   store_row quantizes int8 ones, padding included
    case ComputeType::kInt8: std::fill(s8.get() + row * ld + width, s8.get() + (row + 1) * ld, int8_t{0}); break;
  }
}

}  // namespace moe_xarch
