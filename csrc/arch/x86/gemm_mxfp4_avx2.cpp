// AVX2 + FMA MXFP4 kernels: rows widened for the GEMMs, and the fused
// GEMM of few rows of a (mxfp4_tiles.h), FMA on fp32.
//
// The fused GEMM's step is 32 bytes of b: 64 values, two blocks of 32, one in
// each 128-bit half. Each value's fp32 bits are two bytes over two zero bytes
// (every E2M1 value is exact in fp32 with a 2-bit significand): byte shuffles
// look up both bytes of every low and every high nibble, an unpack pairs them
// into words, and each dword's two words go to the top over zeros, one by a
// shift and the other by a blend. No conversion instruction (vcvtph2ps issues
// once a cycle on Zen 3), and the blends run on any vector pipe, where
// shuffles and shifts share two.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "arch/x86/inline.h"
#include "arch/x86/kernels_x86.h"
#include "arch/x86/mxfp4_tiles.h"
#include "core/e8m0.h"
#include "core/kernel_use.h"
#include "core/kernels.h"

namespace moe_xarch {
namespace {

// Widening: the byte-shuffle lookup of gemm_mxfp4_avx512.cpp, 8 values a store.
template <class T, class Store>
MOE_X86_INLINE void mxfp4_row(int64_t cols, const uint8_t* src, const uint8_t* scale, T* dst, Store store) {
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for (int64_t c = 0; c < cols; c += 32) {
    const uint8_t s = scale[c / 32];  // times 1/2, for the doubled table: 2^(s - 128)
    const uint32_t bits = s >= 2 ? static_cast<uint32_t>(s - 1) << 23 : 0x00400000u >> (1 - s);
    float half;
    std::memcpy(&half, &bits, sizeof(half));
    const __m256 factor = _mm256_set1_ps(half);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c / 2));
    const __m128i lo = _mm_and_si128(packed, low4), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low4);
    const __m128i values[2] = {_mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi)),
                               _mm_shuffle_epi8(table, _mm_unpackhi_epi8(lo, hi))};
    for (int h = 0; h < 2; ++h) {
      const __m256 v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(values[h])), factor);
      const __m256 v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(values[h], 8))), factor);
      store(dst + c + 16 * h, v0, v1);
    }
  }
}

// Slot s of a step (part t = 4 w + 2 e + h, lane l = s % 8 in half l / 4)
// holds value 2 (16 (l / 4) + 8 w + 2 (l % 4) + e) + h: byte 8 w + 2 (l % 4) + e
// of the half, its low (h = 0) or high nibble.
struct SlotValues {
  uint8_t value[64];
};

constexpr SlotValues make_slot_values() {
  SlotValues t{};
  for (int s = 0; s < 64; ++s) {
    const int part = s / 8, w = part / 4, e = part / 2 % 2, h = part % 2, l = s % 8;
    t.value[s] = static_cast<uint8_t>(2 * (16 * (l / 4) + 8 * w + 2 * (l % 4) + e) + h);
  }
  return t;
}

constexpr SlotValues kSlotValue = make_slot_values();

// core/e8m0.h's byte tables in both 128-bit halves, for the halves' byte shuffles.
struct E2m1BytesTwice {
  alignas(32) uint8_t value[32];
};

constexpr E2m1BytesTwice twice(const E2m1Bytes& t) {
  E2m1BytesTwice r{};
  for (int i = 0; i < 32; ++i) r.value[i] = t.value[i % 16];
  return r;
}

constexpr E2m1BytesTwice kE2m1LowTwice = twice(kE2m1Low), kE2m1HighTwice = twice(kE2m1High);

struct FmaMxfp4 {
  using A = float;
  using Vec = __m256;
  using Acc = __m256;
  static constexpr int64_t kStep = 64;
  static constexpr int kParts = 8;
  static constexpr int kSums = 2;  // 4 FMAs deep, not 8: the 4-cycle chain bounded a one-row step
  static constexpr int kNR = 1;  // the 8 parts and 4 rows' totals fill the 16 registers
  static constexpr int kNR1 = 2;

  // Slot s of a step holds value kSlotValue.value[s]. A table: the driver
  // calls this for every row of a in every tile of 128-256 rows of b.
  static MOE_X86_INLINE void reorder(const uint16_t* a, int64_t values, float* out) {
    const auto widen = [](uint16_t bf16) { return __builtin_bit_cast(float, static_cast<uint32_t>(bf16) << 16); };
    if (values == kStep) {
      for (int64_t s = 0; s < kStep; ++s) out[s] = widen(a[kSlotValue.value[s]]);
      return;
    }
    for (int64_t s = 0; s < kStep; ++s) out[s] = kSlotValue.value[s] < values ? widen(a[kSlotValue.value[s]]) : 0.f;
  }

  static MOE_X86_INLINE Acc zero() { return _mm256_setzero_ps(); }

  static MOE_X86_INLINE void decode(const uint8_t* b, int64_t bytes, Vec (&v)[kParts]) {
    const __m256i byte2 = _mm256_load_si256(reinterpret_cast<const __m256i*>(kE2m1LowTwice.value));
    const __m256i byte3 = _mm256_load_si256(reinterpret_cast<const __m256i*>(kE2m1HighTwice.value));
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i zero = _mm256_setzero_si256();
    // A K tail of 32 values reads its 16 bytes only.
    const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m256i x = bytes == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))
                                  : _mm256_inserti128_si256(_mm256_setzero_si256(), first, 0);
    const __m256i nibbles[2] = {_mm256_and_si256(x, low4), _mm256_and_si256(_mm256_srli_epi16(x, 4), low4)};
    for (int h = 0; h < 2; ++h) {
      const __m256i lo = _mm256_shuffle_epi8(byte2, nibbles[h]), hi = _mm256_shuffle_epi8(byte3, nibbles[h]);
      const __m256i words[2] = {_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi)};
      for (int w = 0; w < 2; ++w) {
        v[4 * w + h] = _mm256_castsi256_ps(_mm256_slli_epi32(words[w], 16));
        v[4 * w + 2 + h] = _mm256_castsi256_ps(_mm256_blend_epi16(zero, words[w], 0xaa));
      }
    }
  }

  // Lanes [0, 4) the first block's, [4, 8) the second's (zero past the row's end).
  static MOE_X86_INLINE Acc scales(const uint8_t* s, int64_t blocks) {
    return _mm256_set_m128(_mm_set1_ps(blocks > 1 ? kE8m0.value[s[1]] : 0.f), _mm_set1_ps(kE8m0.value[s[0]]));
  }

  static MOE_X86_INLINE Acc madd(Acc acc, const float* a, Vec v) { return _mm256_fmadd_ps(_mm256_load_ps(a), v, acc); }
  static MOE_X86_INLINE Acc scaled(Acc acc, Acc s, Acc total) { return _mm256_fmadd_ps(acc, s, total); }

  // Once per tile row: a plain reduction is as fast as any here.
  template <int NR>
  static MOE_X86_INLINE void store(const Acc (&total)[NR], float* c, int nb) {
    for (int q = 0; q < nb; ++q) {
      __m128 x = _mm_add_ps(_mm256_castps256_ps128(total[q]), _mm256_extractf128_ps(total[q], 1));
      x = _mm_add_ps(x, _mm_movehl_ps(x, x));
      c[q] = _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
    }
  }
};

// Up to this many rows of a, MXFP4 is widened in registers (KernelSet::gemm_bf16_mxfp4_takes):
// each strip of rows decodes b again, which beats widening to fp32 rows up to 12 rows.
constexpr int kMxfp4TileRows = 12;

}  // namespace

bool avx2::gemm_bf16_mxfp4_takes(int64_t m) { return m <= kMxfp4TileRows; }

void avx2::gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                           int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Mxfp4);
  x86::gemm_bf16_mxfp4_with<FmaMxfp4>(m, n, k, a, lda, b, ldb, scale, scale_ld, c, ldc);
}

void avx2::mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst) {
  MOE_KERNEL_USE(kMxfp4ToBF16);
  // Exact in bf16: its bits are the top halves.
  mxfp4_row(cols, src, scale, dst, [](uint16_t* d, __m256 v0, __m256 v1) {
    const __m256i halves = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(v0), 16),
                                               _mm256_srli_epi32(_mm256_castps_si256(v1), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_permute4x64_epi64(halves, 0xd8));
  });
}

void avx2::mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst) {
  MOE_KERNEL_USE(kMxfp4ToF32);
  mxfp4_row(cols, src, scale, dst, [](float* d, __m256 v0, __m256 v1) {
    _mm256_storeu_ps(d, v0);
    _mm256_storeu_ps(d + 8, v1);
  });
}

}  // namespace moe_xarch
