#include "core/expert_gemm.h"

#include <array>

#include "core/packing.h"
#include "core/scratch.h"
#include "core/stable_torch.h"

namespace moe_xarch {
namespace {

constexpr const char* kWidenedRows = "a thread's widened weight rows (of K or N values)";
constexpr const char* kBlockSums = "a thread's sums of one block of K (fp8)";

}  // namespace

const uint8_t* WeightOperand::expert_rows(int64_t expert, int64_t* ld, const int32_t** row_sums) const {
  if (packed) {
    const PackedView view = packed_expert(*tensor, expert);
    *ld = view.ld;
    *row_sums = view.row_sums;
    return view.values;
  }
  *ld = is_four_bit(dtype) ? cols / 2 : cols;
  *row_sums = nullptr;
  return static_cast<const uint8_t*>(tensor->const_data_ptr()) + expert * rows * row_bytes();
}

int64_t WeightOperand::row_bytes() const {
  return is_four_bit(dtype) ? cols / 2 : cols * static_cast<int64_t>(element_size(dtype));
}

WeightTile ExpertGemm::tile(int64_t expert, int64_t r0, int64_t r1, int64_t m, int64_t a_ld, Scratch& scratch,
                            int64_t slot) const {
  int64_t ld = 0;
  const int32_t* row_sums = nullptr;
  if (!values_valid(expert, r0, r1)) return WeightTile{nullptr, 0, /*k=*/0, r1 - r0, nullptr, nullptr};
  const uint8_t* base = w_.expert_rows(expert, &ld, &row_sums);
  const int64_t elem = element_size(w_.dtype);
  WeightTile t{base + r0 * ld * elem, ld, w_.packed ? a_ld : w_.cols, r1 - r0,
               row_sums ? row_sums + r0 : nullptr,
               w_.channel_scale ? w_.channel_scale + expert * w_.rows + r0 : nullptr};
  t.tiles = w_.tiles;
  if (w_.dtype == kQUInt4x2) {  // read as it is: groups end at the logical width
    t.k = w_.cols;
    t.w4a8 = true;
    const int64_t first = (expert * w_.rows + r0) * w_.scale_cols;
    t.groups = {w_.group_scale + first, w_.group_zero ? w_.group_zero + first : nullptr, w_.scale_cols, w_.group};
    return t;
  }
  if (w_.dtype == kFloat4_e2m1fn_x2 && p_.compute == ComputeType::kBF16 && kernels_.gemm_bf16_mxfp4_takes(m)) {
    t.k = w_.cols;  // blocks end at the logical width, as W4A8's groups
    t.mxfp4 = true;
    t.mx_scale = w_.mx_scale + (expert * w_.rows + r0) * w_.scale_cols;
    t.mx_scale_ld = w_.scale_cols;
    return t;
  }
  if (w_.dtype == kFloat8_e4m3fn) {  // for the fused GEMM, or the blocks of K of a widened tile
    t.fp8_scales = {w_.block_scale + expert * w_.scale_rows * w_.scale_cols, w_.scale_cols, r0, p_.block_n,
                    p_.block_k};
  }
  // fp8 in the line layout goes to gemm_bf16_fp8_tiles whatever m: it has no rows to widen.
  if (w_.dtype == kFloat8_e4m3fn && p_.compute == ComputeType::kBF16 &&
      // coverage: begin unreachable on aarch64 (x86-fp8): the fp8 line layout (kTiles16) and the fused fp8 GEMM are
      //   x86 levels' (KernelSet::tiles, gemm_bf16_fp8): no aarch64 level has them
      (w_.tiles || kernels_.gemm_bf16_fp8_takes(m))) {
    // The logical width: block scales end there, padding or not.
    t.k = w_.cols;
    t.fp8 = true;
      // coverage: end
  } else if (dequantizes()) {
    // Allocated on first use: a level that widens fp8 in its GEMM never needs it.
    if (p_.compute == ComputeType::kBF16) {
      if (!scratch.weights_bf16) scratch.weights_bf16 = aligned_buffer<uint16_t>(kMaxTileRows, a_ld, kWidenedRows);
      uint16_t* out = scratch.weights_bf16.get() + slot * a_ld;
      // e4m3 fits bf16 exactly; a block scale folded in would round every weight to 8 bits.
      const Fp8ToBF16Fn fp8_to_bf16 = kernels_.fp8_to_bf16;
      const auto fp8_exact = [fp8_to_bf16](int64_t cols, const uint8_t* src, const float*, int64_t, uint16_t* dst) {
        fp8_to_bf16(cols, src, dst);
      };
      widen_rows(base, ld, expert, r0, r1, a_ld, out, fp8_exact, kernels_.mxfp4_to_bf16, to_bf16_bits);
      if (w_.dtype == kFloat8_e4m3fn) {
        if (!scratch.block_sums) scratch.block_sums = aligned_buffer<float>(kTokenChunk, kMaxTileRows, kBlockSums);
        t.fp8_block_sums = scratch.block_sums.get();
      }
      t.values = reinterpret_cast<const uint8_t*>(out);
    } else {
      if (!scratch.weights_f32) scratch.weights_f32 = aligned_buffer<float>(kMaxTileRows, a_ld, kWidenedRows);
      float* out = scratch.weights_f32.get() + slot * a_ld;
      widen_rows(base, ld, expert, r0, r1, a_ld, out, kernels_.fp8_to_f32, kernels_.mxfp4_to_f32,
                 [](float v) { return v; });
      t.values = reinterpret_cast<const uint8_t*>(out);
    }
    t.ld = t.k = a_ld;
  }
  return t;
}

void ExpertGemm::run(const Activations& a, int64_t row, int64_t m, const WeightTile& w, float* c) const {
  if (w.k == 0) {  // N = 0: empty dot products, which the kernels are never given (kernels.h)
    std::fill(c, c + m * w.rows, 0.f);
    return;
  }
  switch (p_.compute) {
    case ComputeType::kInt8:
      if (w.w4a8) {
        kernels_.gemm_w4a8(m, w.rows, w.k, a.s8.get() + row * a.ld, a.ld, a.scale.get() + row, w.values, w.ld,
                           w.groups, c, w.rows);
        break;
      }
      (w.tiles ? kernels_.gemm_s8_tiles : kernels_.gemm_s8)(
          m, w.rows, w.k, a.s8.get() + row * a.ld, a.ld, a.scale.get() + row,
          reinterpret_cast<const int8_t*>(w.values), w.ld, w.channel_scale, w.row_sums, c, w.rows);
      break;
    case ComputeType::kBF16:
      if (w.fp8) {
        // coverage: begin unreachable (x86-fp8)
        (w.tiles ? kernels_.gemm_bf16_fp8_tiles : kernels_.gemm_bf16_fp8)(
            m, w.rows, w.k, a.bf16.get() + row * a.ld, a.ld, w.values, w.ld, w.fp8_scales, c, w.rows);
        break;
        // coverage: end
      }
      if (w.fp8_block_sums) {
        run_fp8_blocks(a.bf16.get() + row * a.ld, a.ld, m, w, c);
        break;
      }
      if (w.mxfp4) {
        kernels_.gemm_bf16_mxfp4(m, w.rows, w.k, a.bf16.get() + row * a.ld, a.ld, w.values, w.ld, w.mx_scale,
                                 w.mx_scale_ld, c, w.rows);
        break;
      }
      (w.tiles ? kernels_.gemm_bf16_tiles : kernels_.gemm_bf16)(
          m, w.rows, w.k, a.bf16.get() + row * a.ld, a.ld, reinterpret_cast<const uint16_t*>(w.values), w.ld, c,
          w.rows);
      break;
    case ComputeType::kF32:
      kernels_.gemm_f32(m, w.rows, w.k, a.f32.get() + row * a.ld, a.ld,
                        reinterpret_cast<const float*>(w.values), w.ld, c, w.rows);
      break;
  }
}

void ExpertGemm::run_fp8_blocks(const uint16_t* a, int64_t lda, int64_t m, const WeightTile& w, float* c) const {
  const Fp8Scales& s = w.fp8_scales;
  const auto* b = reinterpret_cast<const uint16_t*>(w.values);
  std::array<float, kMaxTileRows> scale;
  if (w_.cols == 0) std::fill(c, c + m * w.rows, 0.f);  // no block of K, no scale
  for (int64_t p0 = 0, block = 0; p0 < w_.cols; p0 += s.block_k, ++block) {
    // The last block runs on over the zero padding, as the whole tile would.
    const int64_t p1 = w_.cols - p0 <= s.block_k ? w.k : p0 + s.block_k;
    float* sums = block == 0 ? c : w.fp8_block_sums;
    kernels_.gemm_bf16(m, w.rows, p1 - p0, a + p0, lda, b + p0, w.ld, sums, w.rows);
    for (int64_t j = 0; j < w.rows; ++j) scale[j] = s.scale[(s.row0 + j) / s.block_n * s.ld + block];
    for (int64_t i = 0; i < m; ++i) {
      float* ci = c + i * w.rows;
      const float* si = sums + i * w.rows;
      if (block == 0) {
        for (int64_t j = 0; j < w.rows; ++j) ci[j] *= scale[j];
      } else {
        for (int64_t j = 0; j < w.rows; ++j) ci[j] += si[j] * scale[j];
      }
    }
  }
}

bool ExpertGemm::values_valid(int64_t expert, int64_t r0, int64_t r1) const {
  const bool mxfp4 = w_.dtype == kFloat4_e2m1fn_x2;
  const uint8_t* values = mxfp4 ? w_.mx_scale : w_.dtype == kQUInt4x2 ? w_.group_zero : nullptr;
  if (values == nullptr) return true;
  const int64_t largest_valid = mxfp4 ? 254 : 15;
  const int64_t begin = (expert * w_.rows + r0) * w_.scale_cols, end = (expert * w_.rows + r1) * w_.scale_cols;
  uint8_t largest = 0;
  for (int64_t i = begin; i < end; ++i) largest = std::max(largest, values[i]);
  // The expert's next rows' values, which the next tile checks, on their way
  // while this tile's GEMM runs: read cold, this scan waited on memory.
  constexpr int64_t kLine = 64;
  const int64_t ahead = std::min(end + (end - begin), (expert + 1) * w_.rows * w_.scale_cols);
  for (int64_t i = end; i < ahead; i += kLine) __builtin_prefetch(values + i, 0, 2);
  if (largest <= largest_valid) return true;
  // The lowest expert's, whichever thread finds it first: the error is the same on every run.
  const int64_t found = expert << 8 | largest;
  for (int64_t seen = bad_value_.load(std::memory_order_relaxed);
       found < seen && !bad_value_.compare_exchange_weak(seen, found, std::memory_order_relaxed);) {
  }
  return false;
}

void ExpertGemm::check_values() const {
  const int64_t found = bad_value_.load(std::memory_order_relaxed);
  if (found == kNoBadValue) return;
  const int64_t expert = found >> 8, value = found & 0xff;
  MOE_XARCH_CHECK(w_.dtype != kFloat4_e2m1fn_x2, "fused_experts_cpu: ", w_.name,
                  "_scale holds the E8M0 byte 255 (NaN in the OCP spec), which is not a scale (expert ", expert, ")");
  MOE_XARCH_CHECK(false, "fused_experts_cpu: ", w_.name, "_zero must hold zero points in [0, 15], got ", value,
                  " (expert ", expert, ")");
}

Scratch ExpertGemm::scratch() const {
  forget_prepared_rows();
  Scratch s;
  s.out0 = aligned_buffer<float>(kTokenChunk, kMaxTileRows, "a GEMM output tile");
  s.out1 = aligned_buffer<float>(kTokenChunk, kMaxTileRows, "a GEMM output tile");
  s.activated.resize(kMaxTileRows);
  return s;
}

bool ExpertGemm::dequantizes() const {
  return w_.dtype == kHalf || w_.dtype == kFloat8_e4m3fn || w_.dtype == kFloat4_e2m1fn_x2;
}

// fp16 rows (converted here), fp8 rows (times their block scales, by the
// kernel set) or MXFP4 rows (likewise) into a zero-padded tile.
template <typename T, typename Fp8Row, typename Mxfp4Row, typename Convert>
void ExpertGemm::widen_rows(const uint8_t* base, int64_t ld, int64_t expert, int64_t r0, int64_t r1, int64_t ld_out,
                            T* out, Fp8Row fp8_row, Mxfp4Row mxfp4_row, Convert convert) const {
  const int64_t cols = w_.cols;
  std::vector<uint8_t> tiled_row(w_.tiles ? cols : 0);
  for (int64_t r = r0; r < r1; ++r) {
    T* dst = out + (r - r0) * ld_out;
    if (w_.dtype == kFloat4_e2m1fn_x2) {
      mxfp4_row(cols, base + r * ld, w_.mx_scale + (expert * w_.rows + r) * w_.scale_cols, dst);
    } else if (w_.dtype == kHalf) {
      const auto* src = reinterpret_cast<const c10::Half*>(base) + r * ld;
      for (int64_t c = 0; c < cols; ++c) dst[c] = convert(static_cast<float>(src[c]));
    } else {
      const float* scales = w_.block_scale + (expert * w_.scale_rows + r / p_.block_n) * w_.scale_cols;
      const uint8_t* row = base + r * ld;
      if (w_.tiles) {  // fp8 for fp32 compute: gather the row out of its 16-row block first
        // coverage: unreachable (x86-fp8)
        // coverage: unreachable (tile-levels)
        fp8_line_row(base + r / 16 * 16 * ld, r % 16, cols, tiled_row.data());
        row = tiled_row.data();
      }
      fp8_row(cols, row, scales, p_.block_k, dst);
    }
    std::fill(dst + cols, dst + ld_out, T{0});
  }
}

}  // namespace moe_xarch
