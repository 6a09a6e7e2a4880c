// AVX-512 BF16: the fused MXFP4 GEMM on vdpbf16ps (mxfp4_tiles.h). Every
// E2M1 value is exact in bf16: a 64-byte step of b holds 32 words of 4
// nibbles each; part t of the step is nibble t of every word, shifted down and
// looked up as bf16 by vpermw, which reads the index's low 5 bits - the nibble
// and the next one's lowest bit, so the table holds the 16 values twice. Word
// i of part t holds value 4 i + t, and the pairs that vdpbf16ps adds into fp32
// lane l (words 2 l and 2 l + 1) lie in block l / 4. The block scales apply to
// the fp32 lane sums (mxfp4_avx512.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
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

// The E2M1 values' bf16 bit patterns by nibble (sign bit 3), twice.
alignas(64) constexpr uint16_t kE2m1BF16Twice[32] = {
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
    0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0,
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
    0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0};

// Words 4 i of two vectors, in lanes i < 16.
alignas(64) constexpr uint16_t kEvery4th[32] = {0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60};

struct DpBF16Mxfp4 : x86::Mxfp4StepAvx512 {
  using A = uint16_t;
  using Vec = __m512bh;
  static constexpr int kParts = 4;
  static constexpr int kSums = 1;
  static constexpr int kNR = 4;
  static constexpr int kNR1 = 8;

  // Part t's values of a, 4 i + t: the first 16 from the step's first 64
  // values, the next 16 from the others.
  static MOE_X86_INLINE void reorder(const uint16_t* a, int64_t values, uint16_t* out) {
    __m512i x[4];
    load_a(a, values, x);
    const __m512i every_4th = _mm512_load_si512(kEvery4th);
    for (int t = 0; t < kParts; ++t) {
      const __m512i index = _mm512_add_epi16(every_4th, _mm512_set1_epi16(static_cast<int16_t>(t)));
      const __m512i first = _mm512_permutex2var_epi16(x[0], index, x[1]);
      const __m512i second = _mm512_permutex2var_epi16(x[2], index, x[3]);
      _mm512_store_si512(out + 32 * t, _mm512_shuffle_i64x2(first, second, 0x44));
    }
  }

  static MOE_X86_INLINE void decode(const uint8_t* b, int64_t bytes, Vec (&v)[kParts]) {
    const __m512i table = _mm512_load_si512(kE2m1BF16Twice);
    const __m512i w = load(b, bytes);
    v[0] = reinterpret_cast<Vec>(_mm512_permutexvar_epi16(w, table));
    for (int t = 1; t < kParts; ++t) {
      v[t] = reinterpret_cast<Vec>(_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4 * t), table));
    }
  }

  static MOE_X86_INLINE Acc madd(Acc acc, const uint16_t* a, Vec v) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(_mm512_load_si512(a)), v);
  }
};

// Up to this many rows of a, MXFP4 is widened in registers (KernelSet::gemm_bf16_mxfp4_takes):
// each strip of rows decodes b again, which beats widened rows up to 8 rows.
constexpr int kMxfp4TileRows = 8;

}  // namespace

bool avx512_bf16::gemm_bf16_mxfp4_takes(int64_t m) { return m <= kMxfp4TileRows; }

void avx512_bf16::gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                                  const uint8_t* b, int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c,
                                  int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Mxfp4);
  x86::gemm_bf16_mxfp4_with<DpBF16Mxfp4>(m, n, k, a, lda, b, ldb, scale, scale_ld, c, ldc);
}

}  // namespace moe_xarch
