// INT4_W4A8's operands as the avx2 and AVX-512 kernels read them, ISA-neutral
// (gemm_int4_avx512.cpp says why this form): rows of a in step order (per
// kStep values of K: the even ones, then the odd ones, zero-padded to whole
// steps), their sums per 32-value chunk, and per row of b and chunk, the
// group's scale and scale * zero point (zero past k); chunks a row padded to
// a multiple of 16.
// Templates in an anonymous namespace on purpose: every including file gets
// a private copy built with its own ISA flags, so the linker can never pick
// one level's copy for another's path. No C++ library headers.
#pragma once

#include "arch/x86/loop_nest.h"
#include "core/kernels.h"
#include "core/scratch.h"

namespace moe_xarch::x86 {
namespace {

constexpr int64_t kW4A8Chunk = 32;

template <int64_t kStep>
struct W4A8Operands {
  int64_t lda, chunks;
  int8_t* a;
  float* a_sums;
  float* scales;
  float* zero_scales;

  W4A8Operands(int64_t m, int64_t n, int64_t k, const int8_t* a_rows, int64_t a_ld, const Int4Groups& groups)
      : lda((k + kStep - 1) / kStep * kStep), chunks((lda / kW4A8Chunk + 15) / 16 * 16) {
    const int64_t a_bytes = m * lda, sums_bytes = m * chunks * 4, scale_bytes = n * chunks * 4;
    uint8_t* scratch = thread_scratch(ScratchUse::kInt4Groups, a_bytes + sums_bytes + 2 * scale_bytes);
    a = reinterpret_cast<int8_t*>(scratch);
    a_sums = reinterpret_cast<float*>(scratch + a_bytes);
    scales = reinterpret_cast<float*>(scratch + a_bytes + sums_bytes);
    zero_scales = reinterpret_cast<float*>(scratch + a_bytes + sums_bytes + scale_bytes);
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* row = a_rows + i * a_ld;
      int8_t* dst = a + i * lda;
      for (int64_t p = 0; p < lda; ++p) {
        const int64_t at = p % kStep;
        dst[p - at + at % 2 * (kStep / 2) + at / 2] = p < k ? row[p] : int8_t{0};
      }
      for (int64_t t = 0; t < chunks; ++t) {
        int32_t sum = 0;
        for (int64_t p = t * kW4A8Chunk; p < (t + 1) * kW4A8Chunk && p < k; ++p) sum += row[p];
        a_sums[i * chunks + t] = static_cast<float>(sum);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t t = 0; t < chunks; ++t) {
        const int64_t g = t * kW4A8Chunk / groups.group;
        const bool inside = t * kW4A8Chunk < k;
        const float scale = inside ? groups.scale[j * groups.ld + g] : 0.f;
        const int zero = groups.zero == nullptr ? 8 : inside ? groups.zero[j * groups.ld + g] : 0;
        scales[j * chunks + t] = scale;
        zero_scales[j * chunks + t] = scale * static_cast<float>(zero);
      }
    }
  }
};

// What a level's W4A8 tiles read and write, whatever its vector width: the
// prepared a, its row scales, the packed b and the fp32 output.
template <int64_t kStepValues>
struct W4A8TileArgs {
  static constexpr int64_t kStep = kStepValues;  // values of K per vector step
  using T = uint8_t;
  static constexpr int64_t kKBlock = 0;

  const W4A8Operands<kStepValues>& ops;
  const float* a_scale;
  const uint8_t* b;
  int64_t ldb;
  float* c;
  int64_t ldc;

  int64_t row_bytes() const { return ldb; }
};

// A W4A8 tile's NR rows of b and their chunk scales; past the edge the last repeats (as TileRows).
template <int NR>
struct W4A8Columns {
  const uint8_t* b[NR];
  const float* scale[NR];
  const float* zero_scale[NR];
  template <int64_t kStep>
  W4A8Columns(const W4A8Operands<kStep>& ops, const uint8_t* b0, int64_t ldb, const TileCols& cols) {
    for (int q = 0; q < NR; ++q) {
      const int64_t j = cols.j + (q < cols.nb ? q : cols.nb - 1) * cols.stride;
      b[q] = b0 + j * ldb;
      scale[q] = ops.scales + j * ops.chunks;
      zero_scale[q] = ops.zero_scales + j * ops.chunks;
    }
  }
};

}  // namespace
}  // namespace moe_xarch::x86
