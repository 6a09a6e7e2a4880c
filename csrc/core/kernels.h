// The internal kernel interface every instruction-set path implements.
//
// torch-free on purpose: the per-ISA files are compiled with ISA flags and
// must not emit copies of inline library functions that other translation
// units could pick up; all of a kernel file lives in an anonymous namespace
// but what its level exports, named in the level's namespace: <level>::kernels()
// and the functions it lends other levels (avx512::gemm_w4a8).
//
// All GEMMs are in dot-product form, matching the weights' layout (row =
// output channel, K contiguous), overwriting c, in fp32 (int32 for int8):
//     c[i * ldc + j] = sum_{p < k} a[i * lda + p] * b[j * ldb + p]   (i < m, j < n)
// m, n, k are any positive values; a kernel reads a and b only in [0, k) of
// each row and handles tails itself. When the driver knows both operands are
// zero-padded (packed weights) it passes k rounded up to kPackAlign.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/packed_layout.h"

namespace moe_xarch {

using GemmF32Fn = void (*)(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                           const float* b, int64_t ldb, float* c, int64_t ldc);

// a and b hold bfloat16 bit patterns.
using GemmBF16Fn = void (*)(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                            const uint16_t* b, int64_t ldb, float* c, int64_t ldc);

// c = (int32 dot of row i of a and row j of b) * a_scale[i] * b_scale[j].
// b_sum (may be null) holds sum_p b[j * ldb + p] over [0, k), precomputed by
// packing; kernels that need it (x86 VNNI's unsigned*signed trick) compute it
// on the fly when it is null.
using GemmS8Fn = void (*)(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda,
                          const float* a_scale, const int8_t* b, int64_t ldb,
                          const float* b_scale, const int32_t* b_sum, float* c, int64_t ldc);

// One row of fp8 e4m3 weights widened for a GEMM. To bf16 exactly (e4m3 is a
// subset of bf16; the driver applies block scales to each block of K's sums):
//     dst[c] = e4m3(src[c]) for c < cols;
// to fp32 times its block scales: dst[c] = e4m3(src[c]) * scale[c / block_k].
using Fp8ToBF16Fn = void (*)(int64_t cols, const uint8_t* src, uint16_t* dst);
using Fp8ToF32Fn = void (*)(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k,
                            float* dst);

// Where row j of an fp8 GEMM operand finds its block scales: row row0 + j of
// the weight, whose scale for values [q * block_k, (q + 1) * block_k) is
// scale[((row0 + j) / block_n) * ld + q].
struct Fp8Scales {
  const float* scale;
  int64_t ld, row0, block_n, block_k;
};

// c = a times fp8 e4m3 b with its block scales (rows of b as in the GEMMs above):
//     c[i * ldc + j] = sum_p a[i * lda + p] * e4m3(b[j * ldb + p]) * scale of (j, p).
// For few rows of a: b is widened on the fly, never stored.
using GemmBF16Fp8Fn = void (*)(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                               const uint8_t* b, int64_t ldb, const Fp8Scales& scales, float* c,
                               int64_t ldc);

// Whether a kernel takes m rows of a (see KernelSet::gemm_bf16_fp8_takes).
using TakesRowsFn = bool (*)(int64_t m);
bool takes_no_rows(int64_t m);

// INT4_W4A8's per-group scales and zero points of row j (row0 + j of the
// weight): value p = (q - zero[g]) * scale[g], g = p / group; nibble order as
// core/packed_layout.h describes.
struct Int4Groups {
  const float* scale;   // [rows, ld]
  const uint8_t* zero;  // [rows, ld]; null: zero point 8
  int64_t ld;           // groups per row
  int64_t group;        // a multiple of 32
};

// c = sum over groups g of a_scale[i] * scale[g] * (int32 dot of q_w and a
// over the group - zero[g] * sum of a over the group). b holds n rows of
// 4-bit values, ldb bytes apart; k is a multiple of 32 and a row of a has
// k values (no padding is read from b).
using GemmW4A8Fn = void (*)(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda,
                            const float* a_scale, const uint8_t* b, int64_t ldb, const Int4Groups& groups,
                            float* c, int64_t ldc);

// One row of MXFP4 weights widened for a GEMM: dst[c] = e2m1(nibble c of src)
// * 2^(scale[c / 32] - 127) for c < cols (cols a multiple of 32), as bf16
// (exact) or fp32.
using Mxfp4ToBF16Fn = void (*)(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst);
using Mxfp4ToF32Fn = void (*)(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst);

// c = a times MXFP4 b (rows of b as in the GEMMs above, ldb bytes apart),
// row j's E8M0 scale of values [32 q, 32 q + 32) at scale[j * scale_ld + q]:
//     c[i * ldc + j] = sum_p a[i * lda + p] * e2m1(nibble p of row j) * 2^(scale of (j, p) - 127).
// k is a multiple of 32, the logical width (b is read no further). For few
// rows of a: b is widened in registers, never stored.
using GemmBF16Mxfp4Fn = void (*)(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                                 int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc);

// The driver's row loops (core/row_kernels.h), compiled by each level.
using SiluAndMulFn = void (*)(int64_t n, const float* gate, const float* up, const float* gate_bias,
                              const float* up_bias, float* out);
using SwigluFn = void (*)(int64_t n, const float* h, const float* bias, float alpha, float limit, float* out);
using QuantizeRowFn = void (*)(int64_t n, const float* x, int8_t* q, float* scale);
using AddWeightedFn = void (*)(int64_t n, float weight, const float* c, const float* bias, float* dst);

struct KernelSet;

// The generic level (csrc/generic/): portable kernels, and what every KernelSet
// holds until a level puts its own over them.
namespace generic {
const KernelSet& kernels();
void fp8_to_bf16(int64_t cols, const uint8_t* src, uint16_t* dst);
void fp8_to_f32(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k, float* dst);
void gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
               const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc);
void mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst);
void mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst);
// The row loops built for the architecture's baseline.
void silu_and_mul(int64_t n, const float* gate, const float* up, const float* gate_bias, const float* up_bias,
                  float* out);
void swiglu(int64_t n, const float* h, const float* bias, float alpha, float limit, float* out);
void quantize_row_s8(int64_t n, const float* x, int8_t* q, float* scale);
void add_weighted(int64_t n, float weight, const float* c, const float* bias, float* dst);
}  // namespace generic

struct KernelSet {
  GemmF32Fn gemm_f32;
  GemmBF16Fn gemm_bf16;
  GemmS8Fn gemm_s8;
  Fp8ToBF16Fn fp8_to_bf16 = generic::fp8_to_bf16;
  Fp8ToF32Fn fp8_to_f32 = generic::fp8_to_f32;
  GemmBF16Fp8Fn gemm_bf16_fp8 = nullptr;
  // Whether gemm_bf16_fp8 takes fp8 weights in the row layout for m rows of
  // a; if not, the driver widens each tile once for all rows, for gemm_bf16.
  // The level's own choice: a kernel that widens in registers redoes it for
  // every few rows.
  TakesRowsFn gemm_bf16_fp8_takes = takes_no_rows;
  // The tile layout the *_tiles GEMMs below read (core/packed_layout.h); kRows:
  // the level reads rows only. The level is given bf16 and int8 weights (and
  // kTiles16's fp8, in its line layout) in that layout wherever it applies
  // (tiles_apply), and has a *_tiles GEMM for each such dtype. b points at the
  // first row of a block, n is a multiple of the block's rows and k == ldb; for
  // fp8, any number of rows of a, k the logical width (block scales end
  // there) and ldb the padded one.
  PackLayout tiles = PackLayout::kRows;
  GemmBF16Fn gemm_bf16_tiles = nullptr;
  GemmS8Fn gemm_s8_tiles = nullptr;
  GemmBF16Fp8Fn gemm_bf16_fp8_tiles = nullptr;
  GemmW4A8Fn gemm_w4a8 = generic::gemm_w4a8;
  Mxfp4ToBF16Fn mxfp4_to_bf16 = generic::mxfp4_to_bf16;
  Mxfp4ToF32Fn mxfp4_to_f32 = generic::mxfp4_to_f32;
  GemmBF16Mxfp4Fn gemm_bf16_mxfp4 = nullptr;
  // As gemm_bf16_fp8_takes, for MXFP4 weights (widened by mxfp4_to_bf16).
  TakesRowsFn gemm_bf16_mxfp4_takes = takes_no_rows;
  SiluAndMulFn silu_and_mul = generic::silu_and_mul;
  SwigluFn swiglu = generic::swiglu;
  QuantizeRowFn quantize_row_s8 = generic::quantize_row_s8;
  AddWeightedFn add_weighted = generic::add_weighted;
};

// Every level above generic builds its set one way: the level below's, with
// what the level brings put over it by `own`. Called once, from the level's
// kernels(), which only a CPU that runs the level calls: the copy is compiled
// with the level's ISA flags.
namespace {
template <class Own>
KernelSet above(const KernelSet& below, Own own) {
  KernelSet set = below;
  own(set);
  return set;
}
}  // namespace

}  // namespace moe_xarch
