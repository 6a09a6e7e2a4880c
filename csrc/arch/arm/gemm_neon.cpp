// The aarch64 baseline (Armv8-A Advanced SIMD): fp32 by FMA, bf16 widened to
// fp32, int8 and INT4_W4A8 by widening multiplies, MXFP4 widened by table
// lookup (into a GEMM's rows, or in registers for decode's FMAs). Every
// aarch64 CPU runs this level, and the higher levels fall back to it for k
// below their vector width.
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "arch/arm/kernels_arm.h"
#include "arch/arm/mxfp4.h"
#include "arch/arm/w4a8.h"
#include "core/e8m0.h"
#include "core/kernel_use.h"
#include "core/kernels.h"
#include "core/scratch.h"

namespace moe_xarch {
namespace {

struct F32Ops {
  using T = float;
  using Vec = float32x4_t;
  using Acc = float32x4_t;
  static constexpr int kW = 4;
  static constexpr bool kScaled = false;
  static Acc zero() { return vdupq_n_f32(0.f); }
  static Vec load(const float* p) { return vld1q_f32(p); }
  static Vec load_keep(const float* p, uint8x16_t keep) {
    return vreinterpretq_f32_u8(vandq_u8(vld1q_u8(reinterpret_cast<const uint8_t*>(p)), keep));
  }
  static Acc mac(Acc acc, Vec a, Vec b) { return vfmaq_f32(acc, a, b); }
};

// bf16 is the high half of an fp32, so a 16-bit widening shift is exact.
struct BF16Ops {
  using T = uint16_t;
  using Vec = float32x4x2_t;
  using Acc = float32x4_t;
  static constexpr int kW = 8;
  static constexpr bool kScaled = false;
  static Vec widen(uint16x8_t x) {
    return {{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16)),
             vreinterpretq_f32_u32(vshll_high_n_u16(x, 16))}};
  }
  static Acc zero() { return vdupq_n_f32(0.f); }
  static Vec load(const uint16_t* p) { return widen(vld1q_u16(p)); }
  static Vec load_keep(const uint16_t* p, uint8x16_t keep) {
    const uint8x16_t bytes = vandq_u8(vld1q_u8(reinterpret_cast<const uint8_t*>(p)), keep);
    return widen(vreinterpretq_u16_u8(bytes));
  }
  static Acc mac(Acc acc, Vec a, Vec b) {
    return vfmaq_f32(vfmaq_f32(acc, a.val[0], b.val[0]), a.val[1], b.val[1]);
  }
};

// Each int16 product goes straight into int32 (SADALP). Pairing two products
// in int16 first (SMLAL) would save an instruction but overflows for
// (-128 * -128) * 2, and int8 GEMMs here must be exact for any input.
struct S8Ops : S8Io {
  static Acc mac(Acc acc, Vec a, Vec b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
  }
};

// A W4A8 chunk by widening multiplies: four products a lane in int16 (at most
// 4 * 15 * 128 in magnitude), then into int32.
struct W4A8Dot {
  static int32x4_t chunk(int32x4_t acc, int8x16_t even, int8x16_t odd, int8x16_t a_even, int8x16_t a_odd) {
    int16x8_t p = vmull_s8(vget_low_s8(even), vget_low_s8(a_even));
    p = vmlal_high_s8(p, even, a_even);
    p = vmlal_s8(p, vget_low_s8(odd), vget_low_s8(a_odd));
    return vpadalq_s16(acc, vmlal_high_s8(p, odd, a_odd));
  }
};

// MXFP4 decode's block (mxfp4.h) by FMA: a widened to fp32 with its split,
// each bf16 value of b by a shift. One row of a: a second would need eight
// more registers for its values, and the rows' decodes of b would spill.
struct Mxfp4Fma {
  using A = float;
  using AVec = float32x4x2_t;
  static constexpr int kMR = 1, kNR = 4, kNR1 = 4;
  static void store_a(float* dst, uint16x8_t x) {
    const float32x4x2_t v = BF16Ops::widen(x);
    vst1q_f32(dst, v.val[0]);
    vst1q_f32(dst + 4, v.val[1]);
  }
  static AVec load_a(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4)}}; }
  // The even values' and the odd values' FMAs in two chains: half the latency of one.
  static float32x4_t block(const AVec (&a)[4], const uint16x8_t (&b)[4]) {
    float32x4_t sum[2];
    MOE_ARM_UNROLL for (int h = 0; h < 2; ++h) {
      const float32x4x2_t x = BF16Ops::widen(b[2 * h]), y = BF16Ops::widen(b[2 * h + 1]);
      sum[h] = vmulq_f32(a[2 * h].val[0], x.val[0]);
      sum[h] = vfmaq_f32(sum[h], a[2 * h].val[1], x.val[1]);
      sum[h] = vfmaq_f32(sum[h], a[2 * h + 1].val[0], y.val[0]);
      sum[h] = vfmaq_f32(sum[h], a[2 * h + 1].val[1], y.val[1]);
    }
    return vaddq_f32(sum[0], sum[1]);
  }
};

// MXFP4, 32 values (one scale) a step: the block's 16 possible values, E2M1
// times the scale, are exact in bf16 (or inf), so their bf16 bits are two
// byte tables (low and high bytes); TBL then looks up the even values (low
// nibbles) and the odd ones (high nibbles), and an interleaving store puts
// them in order.
struct Mxfp4ByteTables {
  uint8_t low[256][16], high[256][16];  // byte 255 (NaN) is refused: its rows stay zero
};

// Those tables for every scale s, made once for every widening: 8 KiB that a
// block loads, where computing its tables took 8 vector instructions a block.
const Mxfp4ByteTables& byte_tables() {
  static const Mxfp4ByteTables tables = [] {
    Mxfp4ByteTables t{};
    for (int s = 0; s < 255; ++s) {
      for (int x = 0; x < 16; ++x) {
        const uint32_t bits = __builtin_bit_cast(uint32_t, kE2m1[x] * kE8m0.value[s]);
        t.low[s][x] = static_cast<uint8_t>(bits >> 16);
        t.high[s][x] = static_cast<uint8_t>(bits >> 24);
      }
    }
    return t;
  }();
  return tables;
}

// store(c, lo_even, hi_even, lo_odd, hi_odd): the bf16 bytes of values
// [c, c + 32), each vector 16 of them.
template <class Store>
void mxfp4_row(int64_t cols, const uint8_t* src, const uint8_t* scale, Store store) {
  const Mxfp4ByteTables& tables = byte_tables();
  const uint8x16_t low4 = vdupq_n_u8(15);
  for (int64_t c = 0; c < cols; c += 32) {
    const uint8_t s = scale[c / 32];
    const uint8x16_t lo = vld1q_u8(tables.low[s]), hi = vld1q_u8(tables.high[s]);
    const uint8x16_t x = vld1q_u8(src + c / 2);
    const uint8x16_t even = vandq_u8(x, low4), odd = vshrq_n_u8(x, 4);
    store(c, vqtbl1q_u8(lo, even), vqtbl1q_u8(hi, even), vqtbl1q_u8(lo, odd), vqtbl1q_u8(hi, odd));
  }
}

float bf16_to_f32(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// bf16 has no multiply at this level: each value is widened to fp32 first. In
// BF16Ops's tiles that takes as many vector instructions as half their FMAs;
// from this many rows of a on, a and b are widened once per call instead (b
// then costs 1/m of the FMAs, a 1/n) and the fp32 tiles do the work.
constexpr int64_t kBF16WidenedFromRows = 8;

// rows x k bf16 values (ld apart; k >= 8) into fp32 rows k apart.
MOE_ARM_ROWS_PASS void widen_bf16_rows(int64_t rows, int64_t k, const uint16_t* src, int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* in = src + r * ld;
    float* out = dst + r * k;
    for (int64_t step = 0; step < k; step += 8) {
      const int64_t p = min_i64(step, k - 8);  // the last step may overlap the one before: the same values again
      const float32x4x2_t wide = BF16Ops::load(in + p);
      vst1q_f32(out + p, wide.val[0]);
      vst1q_f32(out + p + 4, wide.val[1]);
    }
  }
}

// k shorter than one vector: plain loops (Acc is float or int32_t).
template <class Acc, class T, class Widen>
void gemm_short_k(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
                  int64_t ldb, float* c, int64_t ldc, const float* a_scale, const float* b_scale,
                  Widen widen) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      Acc acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += widen(a[i * lda + p]) * widen(b[j * ldb + p]);
      float v = static_cast<float>(acc);
      if (a_scale) v = v * a_scale[i] * b_scale[j];
      c[i * ldc + j] = v;
    }
  }
}

void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
              int64_t ldc) {
  MOE_KERNEL_USE(kGemmF32);
  if (k < F32Ops::kW) {
    return gemm_short_k<float>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr,
                               [](float x) { return x; });
  }
  gemm_dot<F32Ops, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr);
}

}  // namespace

void neon::gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
                     int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16);
  if (k < BF16Ops::kW) {
    return gemm_short_k<float>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr, bf16_to_f32);
  }
  if (m >= kBF16WidenedFromRows) {
    float* wide_a = reinterpret_cast<float*>(thread_scratch(ScratchUse::kRowsOfA, (m + n) * k * 4));
    float* wide_b = wide_a + m * k;
    widen_bf16_rows(m, k, a, lda, wide_a);
    widen_bf16_rows(n, k, b, ldb, wide_b);
    return gemm_dot<F32Ops, 4, 4, 8>(m, n, k, wide_a, k, wide_b, k, c, ldc, nullptr, nullptr);
  }
  gemm_dot<BF16Ops, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc, nullptr, nullptr);
}

// b_sum is unused: signed times signed needs no correction term.
void neon::gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                   const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* /*b_sum*/, float* c,
                   int64_t ldc) {
  MOE_KERNEL_USE(kGemmS8);
  if (k < S8Ops::kW) {
    return gemm_short_k<int32_t>(m, n, k, a, lda, b, ldb, c, ldc, a_scale, b_scale,
                                 [](int8_t x) { return int32_t{x}; });
  }
  gemm_dot<S8Ops, 4, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc, a_scale, b_scale);
}

namespace {

void gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale, const uint8_t* b,
               int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmW4A8);
  gemm_w4a8_tiled<W4A8Dot, 4, 4, 8>(m, n, k, a, lda, a_scale, b, ldb, groups, c, ldc);
}

// The MXFP4 widening of every level: a TBL lookup has nothing to gain from
// the higher levels' instructions.
void mxfp4_to_bf16(int64_t cols, const uint8_t* src, const uint8_t* scale, uint16_t* dst) {
  MOE_KERNEL_USE(kMxfp4ToBF16);
  mxfp4_row(cols, src, scale, [dst](int64_t c, uint8x16_t lo_even, uint8x16_t hi_even, uint8x16_t lo_odd,
                                    uint8x16_t hi_odd) {
    vst4q_u8(reinterpret_cast<uint8_t*>(dst + c), {{lo_even, hi_even, lo_odd, hi_odd}});
  });
}

bool gemm_bf16_mxfp4_takes(int64_t m) { return mxfp4_takes<Mxfp4Fma>(m); }

// The fused MXFP4 GEMM of decode (mxfp4.h) by FMA on fp32; dotprod's too.
void gemm_bf16_mxfp4(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b,
                     int64_t ldb, const uint8_t* scale, int64_t scale_ld, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Mxfp4);
  gemm_bf16_mxfp4_tiled<Mxfp4Fma>(m, n, k, a, lda, b, ldb, scale, scale_ld, c, ldc);
}

// An fp32 is its bf16 bits above 16 zero bits.
void mxfp4_to_f32(int64_t cols, const uint8_t* src, const uint8_t* scale, float* dst) {
  MOE_KERNEL_USE(kMxfp4ToF32);
  mxfp4_row(cols, src, scale, [dst](int64_t c, uint8x16_t lo_even, uint8x16_t hi_even, uint8x16_t lo_odd,
                                    uint8x16_t hi_odd) {
    const uint16x8_t zero = vdupq_n_u16(0);
    uint16_t* out = reinterpret_cast<uint16_t*>(dst + c);
    vst4q_u16(out, {{zero, vreinterpretq_u16_u8(vzip1q_u8(lo_even, hi_even)), zero,
                     vreinterpretq_u16_u8(vzip1q_u8(lo_odd, hi_odd))}});
    vst4q_u16(out + 32, {{zero, vreinterpretq_u16_u8(vzip2q_u8(lo_even, hi_even)), zero,
                          vreinterpretq_u16_u8(vzip2q_u8(lo_odd, hi_odd))}});
  });
}

}  // namespace

const KernelSet& neon::kernels() {
  static const KernelSet kernels = above(generic::kernels(), [](KernelSet& set) {
    set.gemm_f32 = gemm_f32;
    set.gemm_bf16 = gemm_bf16;
    set.gemm_s8 = gemm_s8;
    set.gemm_w4a8 = gemm_w4a8;
    set.mxfp4_to_bf16 = mxfp4_to_bf16;
    set.mxfp4_to_f32 = mxfp4_to_f32;
    set.gemm_bf16_mxfp4 = gemm_bf16_mxfp4;
    set.gemm_bf16_mxfp4_takes = gemm_bf16_mxfp4_takes;
  });
  return kernels;
}

}  // namespace moe_xarch
