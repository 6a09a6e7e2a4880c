// AVX-512 BF16: the avx512 level with its bf16 GEMM on vdpbf16ps, which
// multiplies pairs of adjacent K values - a dot product's own order. The f32
// and int8 GEMMs are avx512's.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own
// -Wmaybe-uninitialized then reports once inlined (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "arch/x86/kernels_x86.h"
#include "core/kernels.h"

namespace moe_kernels {
namespace {

struct DpBF16 {
  using T = uint16_t;
  using A = __m512bh;
  using B = __m512bh;
  using Acc = __m512;
  static constexpr int kStep = 32;
  static MOE_X86_INLINE Acc zero() { return _mm512_setzero_ps(); }
  static MOE_X86_INLINE A load_a(const T* p) { return reinterpret_cast<A>(_mm512_loadu_si512(p)); }
  static MOE_X86_INLINE A load_a_tail(const T* p, int rem) {
    return reinterpret_cast<A>(_mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << rem) - 1), p));
  }
  static MOE_X86_INLINE B load_b(const T* p) { return load_a(p); }
  static MOE_X86_INLINE B load_b_tail(const T* p, int rem) { return load_a_tail(p, rem); }
  static MOE_X86_INLINE void madd(Acc& acc, A a, B b) { acc = _mm512_dpbf16_ps(acc, a, b); }
  template <int NR>
  static MOE_X86_INLINE void store(const Acc (&acc)[NR], float* c, int nb, bool add) {
    x86::store_sums_avx512<NR>(acc, c, nb, add);
  }
};

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc) {
  x86::gemm_float<DpBF16, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc);
}

constexpr KernelSet kKernels{"avx512_bf16", avx512::gemm_f32, gemm_bf16, avx512::gemm_s8};

}  // namespace

const KernelSet& kernels_avx512_bf16() { return kKernels; }

}  // namespace moe_kernels
