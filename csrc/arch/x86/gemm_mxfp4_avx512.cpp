// AVX-512 (F, BW, VL, DQ) MXFP4 kernels, also the avx512_bf16 and amx levels'
// but for avx512_bf16's fused GEMM (amx's few rows take this one). That GEMM
// (mxfp4_tiles.h), FMA on fp32: a 64-byte step of b holds 16 dwords of 8
// nibbles; part t is nibble t of every dword, shifted down and looked up by
// vpermps (which reads the index's low 4 bits only), so lane d of part t holds
// value 8 d + t - in block d / 4.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "arch/x86/inline.h"
#include "arch/x86/kernels_x86.h"
#include "arch/x86/mxfp4_avx512.h"
#include "arch/x86/mxfp4_tiles.h"
#include "core/kernel_use.h"
#include "core/kernels.h"

namespace moe_xarch {
namespace {

// The weights come from memory once, a tile's rows one after another:
// prefetched this far ahead, as avx512_bf16's fp8 rows are.
constexpr int64_t kWidenAhead = 1024;

// Each block of 32 of cols values (mxfp4_avx512.h's mxfp4_block) into dst.
template <class T, class Store>
MOE_X86_INLINE void mxfp4_row(int64_t cols, const uint8_t* src, const uint8_t* scale, T* dst, Store store) {
  for (int64_t c = 0; c < cols; c += 32) {
    if (c % 128 == 0) __builtin_prefetch(src + c / 2 + kWidenAhead, 0, 3);
    store(dst + c, src + c / 2, scale[c / 32]);
  }
}

// Words 8 d of two vectors, in lanes d < 8 and again in lanes [8, 16).
alignas(64) constexpr uint16_t kEvery8th[32] = {0, 8, 16, 24, 32, 40, 48, 56, 0, 8, 16, 24, 32, 40, 48, 56};

struct FmaMxfp4 : x86::Mxfp4StepAvx512 {
  using A = float;
  using Vec = __m512;
  static constexpr int kParts = 8;
  static constexpr int kSums = 1;
  static constexpr int kNR = 2;
  static constexpr int kNR1 = 4;

  // Part t's values of a, 8 d + t: the first 8 from the step's first 64
  // values, the next 8 from the others, widened to fp32 (exact).
  static MOE_X86_INLINE void reorder(const uint16_t* a, int64_t values, float* out) {
    __m512i x[4];
    load_a(a, values, x);
    const __m512i every_8th = _mm512_load_si512(kEvery8th);
    for (int t = 0; t < kParts; ++t) {
      const __m512i index = _mm512_add_epi16(every_8th, _mm512_set1_epi16(static_cast<int16_t>(t)));
      const __m512i first = _mm512_permutex2var_epi16(x[0], index, x[1]);
      const __m512i second = _mm512_permutex2var_epi16(x[2], index, x[3]);
      const __m256i bf16 = _mm512_castsi512_si256(_mm512_mask_blend_epi16(0xff00, first, second));
      _mm512_store_ps(out + 16 * t, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16)));
    }
  }

  static MOE_X86_INLINE void decode(const uint8_t* b, int64_t bytes, Vec (&v)[kParts]) {
    const __m512 table = _mm512_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                        -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f);
    const __m512i w = load(b, bytes);
    v[0] = _mm512_permutexvar_ps(w, table);
    for (int t = 1; t < kParts; ++t) v[t] = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4 * t), table);
  }

  static MOE_X86_INLINE Acc madd(Acc acc, const float* a, Vec v) { return _mm512_fmadd_ps(_mm512_load_ps(a), v, acc); }
};

// Up to this many rows of a, MXFP4 is widened in registers (KernelSet::gemm_bf16_mxfp4_takes):
// each strip of rows decodes b again, which beats widened rows up to 8 rows.
constexpr int kMxfp4TileRows = 8;

}  // namespace

bool avx512::gemm_bf16_mxfp4_takes(int64_t m) { return m <= kMxfp4TileRows; }

void avx512::gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                             int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Mxfp4);
  x86::gemm_bf16_mxfp4_with<FmaMxfp4>(m, n, k, a, lda, b, ldb, scale, scale_ld, c, ldc);
}

void avx512::mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst) {
  MOE_KERNEL_USE(kMxfp4ToBF16);
  mxfp4_row(cols, src, scale, dst, [](uint16_t* d, const uint8_t* block, uint8_t s) {
    _mm512_storeu_si512(d, x86::mxfp4_block_bf16(block, s));
  });
}

void avx512::mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst) {
  MOE_KERNEL_USE(kMxfp4ToF32);
  mxfp4_row(cols, src, scale, dst, [](float* d, const uint8_t* block, uint8_t s) {
    __m512 v[2];
    x86::mxfp4_block(block, s, v);
    _mm512_storeu_ps(d, v[0]);
    _mm512_storeu_ps(d + 16, v[1]);
  });
}

}  // namespace moe_xarch
