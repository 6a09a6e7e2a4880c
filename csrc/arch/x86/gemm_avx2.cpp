// AVX2 + FMA kernels: 8-lane fp32 / int32 accumulators along K in register
// tiles sized for 16 ymm registers (3x4 f32, 2x4 bf16 and int8; 1x8 for
// m = 1), K tails through a zero-padded copy. The loop nest around the tiles
// is loop_nest.h's.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "arch/x86/kernels_x86.h"
#include "arch/x86/loop_nest.h"
#include "arch/x86/w4a8_operands.h"
#include "arch/x86/w4a8_panels.h"
#include "arch/x86/e4m3_fp16.h"
#include "core/kernel_use.h"
#include "core/kernels.h"
#include "core/row_kernels.h"

namespace moe_xarch {
namespace {

MOE_X86_INLINE __m128 hsum4_ps(const __m256 (&v)[4]) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

MOE_X86_INLINE __m256 hsum8_ps(const __m256 (&v)[8]) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

MOE_X86_INLINE __m256i si(__v8si v) { return reinterpret_cast<__m256i>(v); }

MOE_X86_INLINE __m128i hsum4_epi32(const __v8si (&v)[4]) {
  const __m256i t0 = _mm256_hadd_epi32(si(v[0]), si(v[1]));
  const __m256i t = _mm256_hadd_epi32(t0, _mm256_hadd_epi32(si(v[2]), si(v[3])));
  return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

MOE_X86_INLINE __m256i hsum8_epi32(const __v8si (&v)[8]) {
  const __m256i t0 = _mm256_hadd_epi32(si(v[0]), si(v[1]));
  const __m256i t1 = _mm256_hadd_epi32(si(v[4]), si(v[5]));
  const __m256i u0 = _mm256_hadd_epi32(t0, _mm256_hadd_epi32(si(v[2]), si(v[3])));
  const __m256i u1 = _mm256_hadd_epi32(t1, _mm256_hadd_epi32(si(v[6]), si(v[7])));
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

// The rem < W values at p, zero-padded to W. Edges go through memcpy, not
// vmaskmov, whose masked-off lanes are fine on hardware but not under every
// emulator, and whose stores are slow on AMD before Zen 4.
template <class T, int W>
struct Padded {
  alignas(32) T v[W];
  Padded(const T* p, int rem) {
    std::memset(v, 0, sizeof(v));
    std::memcpy(v, p, rem * sizeof(T));
  }
};

template <int NR>
MOE_X86_INLINE void store_sums(const __m256 (&acc)[NR], float* c, int nb, bool add) {
  static_assert(NR == 4 || NR == 8, "tiles are 4 or 8 rows of b wide");
  if constexpr (NR == 4) {
    __m128 v = hsum4_ps(acc);
    if (nb == NR) {
      if (add) v = _mm_add_ps(v, _mm_loadu_ps(c));
      _mm_storeu_ps(c, v);
      return;
    }
    if (add) v = _mm_add_ps(v, _mm_load_ps(Padded<float, NR>(c, nb).v));
    alignas(32) float t[NR];
    _mm_store_ps(t, v);
    std::memcpy(c, t, nb * sizeof(float));
  } else {
    __m256 v = hsum8_ps(acc);
    if (nb == NR) {
      if (add) v = _mm256_add_ps(v, _mm256_loadu_ps(c));
      _mm256_storeu_ps(c, v);
      return;
    }
    // coverage: unreachable: 8-column tiles are the m = 1 stream's, which never cuts K into blocks (nothing to
    //   add to)
    if (add) v = _mm256_add_ps(v, _mm256_load_ps(Padded<float, NR>(c, nb).v));
    alignas(32) float t[NR];
    _mm256_store_ps(t, v);
    std::memcpy(c, t, nb * sizeof(float));
  }
}

struct F32 {
  using T = float;
  using A = __m256;
  using B = __m256;
  using Acc = __m256;
  static constexpr int kStep = 8;
  static MOE_X86_INLINE Acc zero() { return _mm256_setzero_ps(); }
  static MOE_X86_INLINE A load_a(const T* p) { return _mm256_loadu_ps(p); }
  static MOE_X86_INLINE A load_a_tail(const T* p, int rem) {
    return _mm256_load_ps(Padded<T, kStep>(p, rem).v);
  }
  static MOE_X86_INLINE B load_b(const T* p) { return load_a(p); }
  static MOE_X86_INLINE B load_b_tail(const T* p, int rem) { return load_a_tail(p, rem); }
  static MOE_X86_INLINE void madd(Acc& acc, A a, B b) { acc = _mm256_fmadd_ps(a, b, acc); }
  template <int NR>
  static MOE_X86_INLINE void store(const Acc (&acc)[NR], float* c, int nb, bool add) {
    store_sums<NR>(acc, c, nb, add);
  }
};

// bf16 widened to fp32 in registers: the even values of a 16-value load by a
// shift, the odd ones by clearing their low half (a and b are split alike).
struct BF16 {
  using T = uint16_t;
  struct A {
    __m256 even, odd;
  };
  using B = A;
  using Acc = __m256;
  static constexpr int kStep = 16;
  static MOE_X86_INLINE A split(__m256i x) {
    return {_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  static MOE_X86_INLINE Acc zero() { return _mm256_setzero_ps(); }
  static MOE_X86_INLINE A load_a(const T* p) {
    return split(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static MOE_X86_INLINE A load_a_tail(const T* p, int rem) { return load_a(Padded<T, kStep>(p, rem).v); }
  static MOE_X86_INLINE B load_b(const T* p) { return load_a(p); }
  static MOE_X86_INLINE B load_b_tail(const T* p, int rem) { return load_a_tail(p, rem); }
  static MOE_X86_INLINE void madd(Acc& acc, A a, B b) {
    acc = _mm256_fmadd_ps(a.even, b.even, acc);
    acc = _mm256_fmadd_ps(a.odd, b.odd, acc);
  }
  template <int NR>
  static MOE_X86_INLINE void store(const Acc (&acc)[NR], float* c, int nb, bool add) {
    store_sums<NR>(acc, c, nb, add);
  }
};

// int8 sign-extended to int16 and multiplied in pairs into int32: exact
// (vpmaddubsw would saturate).
struct S8 {
  using T = int8_t;
  using A = __m256i;
  using B = __m256i;
  // Not __m256i (64-bit lanes), which costs GCC 12 register copies.
  using Acc = __v8si;
  static constexpr int kStep = 16;
  static MOE_X86_INLINE Acc zero() { return Acc{}; }
  static MOE_X86_INLINE A load_a(const T* p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static MOE_X86_INLINE A load_a_tail(const T* p, int rem) { return load_a(Padded<T, kStep>(p, rem).v); }
  static MOE_X86_INLINE B load_b(const T* p) { return load_a(p); }
  static MOE_X86_INLINE B load_b_tail(const T* p, int rem) { return load_a_tail(p, rem); }
  static MOE_X86_INLINE void madd(Acc& acc, A a, B b) {
    acc += reinterpret_cast<Acc>(_mm256_madd_epi16(a, b));
  }
};

// K is never cut into blocks: the scales apply to the whole int32 dot.
struct S8Tiles {
  static constexpr int kMR = 2;
  static constexpr int kNR = 4;
  static constexpr int kNR1 = 8;
  using T = int8_t;
  static constexpr int64_t kKBlock = 0;

  const int8_t* a;
  int64_t lda;
  const float* a_scale;
  const int8_t* b;
  int64_t ldb;
  const float* b_scale;
  float* c;
  int64_t ldc;

  int64_t row_bytes() const { return ldb; }

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const x86::TileCols& cols, int64_t /*p0*/, int64_t k, bool /*first*/) {
    static_assert(NR == 4 || NR == 8, "tiles are 4 or 8 rows of b wide");
    const x86::TileRows<int8_t, MR, NR> rows(a + i * lda, lda, b + cols.j * ldb, ldb, cols);
    S8::Acc acc[MR][NR];
    S8::Acc unused[NR];
    x86::dot_tile<S8, MR, NR, false>(k, rows, acc, unused);
    alignas(32) float dot[MR][NR];
    for (int r = 0; r < MR; ++r) {
      if constexpr (NR == 4) {
        _mm_store_ps(dot[r], _mm_cvtepi32_ps(hsum4_epi32(acc[r])));
      } else {
        _mm256_store_ps(dot[r], _mm256_cvtepi32_ps(hsum8_epi32(acc[r])));
      }
    }
    for (int r = 0; r < MR; ++r) {
      float* out = c + (i + r) * ldc + cols.j;
      for (int q = 0; q < cols.nb; ++q) {
        out[q * cols.stride] = dot[r][q] * a_scale[i + r] * b_scale[cols.j + q * cols.stride];
      }
    }
  }
};

void gemm_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmF32);
  x86::gemm_float<F32, 3, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc);
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16);
  x86::gemm_float<BF16, 2, 4, 8>(m, n, k, a, lda, b, ldb, c, ldc);
}

void gemm_s8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
             const int8_t* b, int64_t ldb, const float* b_scale, const int32_t* /*b_sum*/, float* c,
             int64_t ldc) {
  MOE_KERNEL_USE(kGemmS8);
  S8Tiles t{a, lda, a_scale, b, ldb, b_scale, c, ldc};
  x86::gemm_tiled(t, m, n, k);
}

// fp32 to bf16 bits in the low half of each lane, rounding to nearest even.
MOE_X86_INLINE __m256i round_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
}

MOE_X86_INLINE void store16(float* d, __m256 lo, __m256 hi) {
  _mm256_storeu_ps(d, lo);
  _mm256_storeu_ps(d + 8, hi);
}

MOE_X86_INLINE void store16(uint16_t* d, __m256 lo, __m256 hi) {
  // packus interleaves 128-bit halves; the permute puts lo's values first.
  const __m256i packed = _mm256_packus_epi32(round_bf16(lo), round_bf16(hi));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_permute4x64_epi64(packed, 0xd8));
}

// One fp8 row, 16 values at a time; block tails through zero-padded copies.
template <class T>
void fp8_row(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k, T* dst) {
  for (int64_t c0 = 0; c0 < cols; c0 += block_k) {
    const int64_t c1 = cols - c0 < block_k ? cols : c0 + block_k;
    const __m256 s = _mm256_set1_ps(x86::fp16_scale(scale[c0 / block_k]));
    for (int64_t c = c0; c < c1; c += 16) {
      const int rem = c1 - c >= 16 ? 16 : static_cast<int>(c1 - c);
      const __m128i bytes = rem == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c))
                                      : _mm_load_si128(reinterpret_cast<const __m128i*>(Padded<uint8_t, 16>(src + c, rem).v));
      const __m256i h = x86::e4m3_to_fp16(_mm256_cvtepi8_epi16(bytes));
      const __m256 lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s);
      const __m256 hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s);
      if (rem == 16) {
        store16(dst + c, lo, hi);
      } else {
        alignas(32) T t[16];
        store16(t, lo, hi);
        std::memcpy(dst + c, t, rem * sizeof(T));
      }
    }
  }
}

// One block of scale 1: exact, as bf16 holds every e4m3 value.
void fp8_to_bf16(int64_t cols, const uint8_t* src, uint16_t* dst) {
  MOE_KERNEL_USE(kFp8ToBF16);
  static constexpr float kUnscaled = 1.f;
  fp8_row(cols, src, &kUnscaled, cols, dst);
}

// The fused fp8 GEMM's tiles, for few rows of a: b widened in registers
// (e4m3 to fp16 bits to fp32), never stored. Each block of K accumulates on
// its own and is added into the totals times its row's scale, 2 x MR x NR
// registers. A step is 16 values of K.
struct Fp8Tiles {
  static constexpr int kMR = 2;
  static constexpr int kNR = 2;
  static constexpr int kNR1 = 4;
  static constexpr int64_t kKBlock = 0;
  static constexpr int kStep = 16;
  using T = uint8_t;

  const uint16_t* a;
  int64_t lda;
  const uint8_t* b;
  int64_t ldb;
  const Fp8Scales& sc;
  float* c;
  int64_t ldc;

  int64_t row_bytes() const { return ldb; }

  static MOE_X86_INLINE void load_a(const uint16_t* src, __m256 (&v)[2]) {
    for (int h = 0; h < 2; ++h) {
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8 * h));
      v[h] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    }
  }

  // 16 e4m3 values as fp32, times 2^-8 (x86::fp16_scale restores it).
  static MOE_X86_INLINE void widen_b(const uint8_t* src, __m256 (&v)[2]) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m256i h = x86::e4m3_to_fp16(_mm256_cvtepi8_epi16(bytes));
    v[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    v[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  }

  using Acc = __m256;
  static MOE_X86_INLINE Acc zero() { return _mm256_setzero_ps(); }
  static MOE_X86_INLINE Acc add_scaled(Acc acc, float block_scale, Acc total) {
    return _mm256_fmadd_ps(acc, _mm256_set1_ps(x86::fp16_scale(block_scale)), total);
  }

  // acc += the products of values [p, p + 16) of K (zero past rem of them).
  template <int MR, int NR, bool kTail>
  MOE_X86_INLINE void step(const uint16_t* const (&pa)[MR], const uint8_t* const (&pb)[NR], int64_t p,
                           int64_t ahead, int64_t rem, __m256 (&acc)[MR][NR]) const {
    __m256 va[MR][2];
    for (int r = 0; r < MR; ++r) {
      if constexpr (kTail) {
        load_a(Padded<uint16_t, kStep>(pa[r] + p, static_cast<int>(rem)).v, va[r]);
      } else {
        load_a(pa[r] + p, va[r]);
      }
    }
    for (int q = 0; q < NR; ++q) {
      // The weights stream from memory once: fetch the rows that come next.
      if (p % 64 == 0) __builtin_prefetch(pb[q] + ahead + p, 0, 2);
      __m256 vb[2];
      if constexpr (kTail) {
        widen_b(Padded<uint8_t, kStep>(pb[q] + p, static_cast<int>(rem)).v, vb);
      } else {
        widen_b(pb[q] + p, vb);
      }
      for (int r = 0; r < MR; ++r) {
        acc[r][q] = _mm256_fmadd_ps(va[r][0], vb[0], acc[r][q]);
        acc[r][q] = _mm256_fmadd_ps(va[r][1], vb[1], acc[r][q]);
      }
    }
  }

  // store_sums reduces 4 vectors: pad with zeros.
  template <int NR>
  MOE_X86_INLINE void store_row(const Acc (&total)[NR], float* dst, const x86::TileCols& cols) const {
    Acc sums[4];
    for (int q = 0; q < 4; ++q) sums[q] = q < NR ? total[q] : zero();
    x86::store_cols<NR>(dst, cols, false, [&](float* d, bool) { store_sums<4>(sums, d, cols.nb, false); });
  }

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const x86::TileCols& cols, int64_t /*p0*/, int64_t k, bool /*first*/) {
    x86::fp8_scaled_tile<MR, NR>(*this, i, cols, k);
  }
};

void gemm_bf16_fp8(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint8_t* b, int64_t ldb,
                   const Fp8Scales& scales, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmBF16Fp8);
  Fp8Tiles t{a, lda, b, ldb, scales, c, ldc};
  x86::gemm_tiled(t, m, n, k);
}

void fp8_to_f32(int64_t cols, const uint8_t* src, const float* scale, int64_t block_k, float* dst) {
  MOE_KERNEL_USE(kFp8ToF32);
  fp8_row(cols, src, scale, block_k, dst);
}

// Up to this many rows of a, widening fp8 in registers beats widening each tile once.
constexpr int64_t kFp8RegisterRows = 4;
bool gemm_bf16_fp8_takes(int64_t m) { return m <= kFp8RegisterRows; }

// INT4_W4A8 as gemm_int4_avx512.cpp does it, 64 values of K a step (a 32-byte
// load of b): vpmaddubsw multiplies nibbles (unsigned) by a (signed) into
// int16 pairs, at most 4 * 15 * 127 once the halves are added, then vpmaddwd
// sums them into int32 lanes, each 128-bit lane one 32-value chunk.
constexpr int64_t kW4A8Step = 64;
constexpr int64_t kInt16Steps = 4;  // 4 * 4 * 15 * 127 < 2^15

// A count of steps known at compile time.
template <int64_t N>
struct ConstSteps {
  constexpr operator int64_t() const { return N; }
};

// f(ConstSteps<n>) for a count n in [1, N].
template <int64_t N, class F>
MOE_X86_INLINE void with_const_steps(int64_t n, F&& f) {
  if constexpr (N > 1) {
    if (n < N) return with_const_steps<N - 1>(n, f);
  }
  f(ConstSteps<N>{});
}

// A row of a in step order, with its chunk sums (x86::W4A8Operands): a byte
// shuffle puts each 16-byte lane's even values before its odd ones, qword and
// lane permutes gather the halves of two loads. A K tail is one 32-value chunk.
void w4a8_prepare_row(const int8_t* row, int64_t k, int8_t* dst, int32_t* chunk_sums) {
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t p = 0; p < k; p += kW4A8Step) {
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p));
    const __m256i x1 = k - p >= kW4A8Step ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p + 32))
                                          : _mm256_setzero_si256();
    // Per load: its 32 even values, then its 32 odd ones.
    const __m256i h0 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(x0, split), 0xd8);
    const __m256i h1 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(x1, split), 0xd8);
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + p), _mm256_permute2x128_si256(h0, h1, 0x20));
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + p + 32), _mm256_permute2x128_si256(h0, h1, 0x31));
    const __m256i d0 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, x0), ones16);
    const __m256i d1 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, x1), ones16);
    __m256i v = _mm256_hadd_epi32(d0, d1);
    v = _mm256_hadd_epi32(v, v);  // per 128-bit lane: the sums of its halves of x0, x1, x0, x1
    const __m128i two = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(chunk_sums + p / x86::kW4A8Chunk), two);
  }
}

struct W4A8Tiles : x86::W4A8TileArgs<kW4A8Step> {
  static constexpr int kMR = 2;
  static constexpr int kNR = 4;
  static constexpr int kNR1 = 4;
  static constexpr bool kRowsInOrder = true;

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const x86::TileCols& cols, int64_t /*p0*/, int64_t k, bool first) {
    x86::w4a8_tile<MR, NR>(*this, i, cols, k, first);
  }

  // acc += rows [i, i + MR) of a times col's rows of b, lane-wise: as
  // gemm_int4_avx512.cpp's, but a step's int16 pair sums add up over
  // kInt16Steps steps before vpmaddwd widens them and their group's scale
  // applies. The first tile on these rows of b prefetches the bytes `ahead`
  // of them, one-row tiles or not: with fewer rows than kW4A8PanelRows, its
  // pass streams them from memory too. Later tiles find them in cache. Into
  // L2, as avx512's: into L1 was 0.71-0.94x on Zen 4.
  template <int MR, int NR, bool kOneGroup>
  MOE_X86_INLINE void accumulate(int64_t i, const x86::W4A8Columns<NR>& col, int64_t k, int64_t ahead, bool first,
                                 __m256 (&acc)[MR][NR]) const {
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const int8_t* a_row[MR];
    for (int r = 0; r < MR; ++r) a_row[r] = ops.a + (i + r) * ops.lda;
    // acc += the int16 pair sums of `count` steps from p on (whole ones, or
    // a K tail of 32 values: its 16 bytes only), times scale(q), computed
    // there and not held: the tile's sums and totals take the registers.
    const auto steps = [&](int64_t p, auto count, bool tail, auto scale) {
      __m256i sums[MR][NR];
      for (int r = 0; r < MR; ++r) {
        for (int q = 0; q < NR; ++q) sums[r][q] = _mm256_setzero_si256();
      }
      for (int64_t s = 0; s < count; ++s, p += kStep) {
        __m256i even[MR], odd[MR];
        for (int r = 0; r < MR; ++r) {
          even[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(a_row[r] + p));
          odd[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(a_row[r] + p + 32));
        }
        for (int q = 0; q < NR; ++q) {
          if (first) __builtin_prefetch(col.b[q] + ahead + p / 2, 0, 2);
          const __m256i packed =
              !tail ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col.b[q] + p / 2))
                    : _mm256_inserti128_si256(_mm256_setzero_si256(),
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(col.b[q] + p / 2)), 0);
          const __m256i lo = _mm256_and_si256(packed, low4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
          for (int r = 0; r < MR; ++r) {
            const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, even[r]), _mm256_maddubs_epi16(hi, odd[r]));
            sums[r][q] = _mm256_add_epi16(sums[r][q], pairs);
            // At the run's last step, the column's sums are done with at
            // once: kept to the end, 4 of them spilled the totals.
            if (s + 1 == count) {
              acc[r][q] =
                  _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sums[r][q], ones)), scale(q), acc[r][q]);
            }
          }
        }
      }
    };
    if constexpr (kOneGroup) {
      // A group's steps in runs of kInt16Steps, then a shorter one, each
      // of a count known at compile time where it can be (ConstSteps): GCC
      // then keeps a run in registers, where a count known only at run time
      // made it spill the sums and reload its pointers each step. Groups of
      // one short run (AWQ's 128, gpt-oss's 64) have no runs and a stride
      // known at compile time: with a run-time stride beside the loop over
      // runs, GCC kept the loop's position in memory.
      const int64_t full_runs = groups.group / kStep / kInt16Steps;
      const int64_t last_steps = groups.group / kStep % kInt16Steps;
      const auto by_runs = [&](auto runs, auto last) {
        const int64_t group = runs * (kInt16Steps * kStep) + last * kStep;  // groups.group
        for (int64_t p0 = 0, g = 0; p0 < k; p0 += group, ++g) {
          const auto scale = [&](int q) { return _mm256_set1_ps(col.scale[q][g]); };
          int64_t p = p0;
          for (int64_t run = 0; run < runs; ++run, p += kInt16Steps * kStep) {
            steps(p, ConstSteps<kInt16Steps>{}, false, scale);
          }
          if (last > 0) steps(p, last, false, scale);
        }
      };
      if (full_runs == 0) {
        with_const_steps<kInt16Steps - 1>(last_steps, [&](auto last) { by_runs(ConstSteps<0>{}, last); });
      } else {
        // Not every count as a constant here (with_const_steps): those tiles
        // ran 2-9% slower at 3 rows of a for groups of 256 and more.
        switch (last_steps) {
          case 0: by_runs(full_runs, ConstSteps<0>{}); break;
          case 1: by_runs(full_runs, ConstSteps<1>{}); break;
          case 2: by_runs(full_runs, ConstSteps<2>{}); break;
          default: by_runs(full_runs, last_steps);
        }
      }
    } else {
      for (int64_t p = 0; p < k; p += kStep) {
        // Each lane's scale by its chunk's group: lanes [0, 4) the step's
        // first chunk's, [4, 8) its second's: two broadcasts, not a gather.
        const int32_t* step_groups = ops.chunk_group + p / x86::kW4A8Chunk;
        const auto scale = [&](int q) {
          return _mm256_set_m128(_mm_broadcast_ss(col.scale[q] + step_groups[1]),
                                 _mm_broadcast_ss(col.scale[q] + step_groups[0]));
        };
        steps(p, ConstSteps<1>{}, k - p < kStep, scale);
      }
    }
  }

  template <int MR, int NR, bool kOneGroup>
  MOE_X86_INLINE void run(int64_t i, const x86::TileCols& cols, int64_t k, bool first) {
    const x86::W4A8Columns<NR> col(b, ldb, groups, cols);
    if (first) col.prefetch_groups(cols.ahead, groups.ld);
    __m256 acc[MR][NR];
    for (int r = 0; r < MR; ++r) {
      for (int q = 0; q < NR; ++q) acc[r][q] = _mm256_setzero_ps();
    }
    if constexpr (MR == 1) {
      // Decode: the tile's rows of b, adjacent (kRowsInOrder), one after
      // another, so that b is one stream.
      for (int q = 0; q < NR; ++q) {
        const x86::W4A8Columns<1> row(b, ldb, groups, cols.column(q));
        __m256 row_acc[1][1] = {{_mm256_setzero_ps()}};
        accumulate<1, 1, kOneGroup>(i, row, k, x86::kStreamAhead, first, row_acc);
        acc[0][q] = row_acc[0][0];
      }
    } else {
      accumulate<MR, NR, kOneGroup>(i, col, k, cols.ahead * ldb, first, acc);
    }
    // The zero points' part, lane-wise by group (the lanes are summed below
    // anyway), 8 groups a vector. Past the last group group_sums holds zeros
    // (W4A8Operands), and a row's scales and zeros are not read past its end.
    const int64_t group_count = k / groups.group;
    for (int64_t g = 0; g < group_count; g += 8) {
      __m256 sums[MR];
      for (int r = 0; r < MR; ++r) sums[r] = _mm256_load_ps(ops.group_sums + (i + r) * ops.sums_ld + g);
      const int64_t left = group_count - g;
      for (int q = 0; q < NR; ++q) {
        __m256 scale;
        uint64_t zeros = 0x0101010101010101u * x86::kW4A8DefaultZero;
        if (left >= 8) {
          scale = _mm256_loadu_ps(col.scale[q] + g);
          if (col.zero[q] != nullptr) std::memcpy(&zeros, col.zero[q] + g, sizeof(zeros));
        } else {
          const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(left)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
          scale = _mm256_maskload_ps(col.scale[q] + g, in);
          // Gathered in a register: stored byte by byte and loaded as one,
          // the zeros stalled the load (no store forwarding).
          if (col.zero[q] != nullptr) {
            zeros = 0;
            for (int64_t u = left - 1; u >= 0; --u) zeros = zeros << 8 | col.zero[q][g + u];
          }
        }
        const __m256i zero_bytes = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(zeros)));
        const __m256 zero_scale = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(zero_bytes));
        for (int r = 0; r < MR; ++r) acc[r][q] = _mm256_fnmadd_ps(zero_scale, sums[r], acc[r][q]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      __m256 out[NR];
      for (int q = 0; q < NR; ++q) out[q] = _mm256_mul_ps(acc[r][q], _mm256_set1_ps(a_scale[i + r]));
      x86::store_cols<NR>(c + (i + r) * ldc + cols.j, cols, false,
                          [&](float* dst, bool) { store_sums<NR>(out, dst, cols.nb, false); });
    }
  }
};

// From this many rows of a, INT4_W4A8's panel kernel (w4a8_panels.h): with
// fewer, its widening pass over b and its half-filled lanes cost more than
// the register tiles do.
constexpr int64_t kW4A8PanelRows = 7;

// w4a8_panels.h's operations with 8 lanes and 32-byte lines: vpmaddubsw
// multiplies widened b (unsigned) by a line (signed) into int16 pairs of one
// row, <= 2 * 15 * 127; kInt16Lines lines of them add up before vpmaddwd
// widens them into the group's int32 lanes.
struct W4A8Panels {
  static constexpr int kLanes = 8;
  static constexpr int kCols = 4;  // with their int16 and int32 sums: 8 of 16 ymm
  static constexpr int kBlockCost = 3;  // so that 8 lanes never split: with scalar stores, a split did not pay
  static constexpr int64_t kLineBytes = 4 * kLanes;
  static constexpr int kInt16Lines = 8;  // 8 * 2 * 15 * 127 = 30,480 < 2^15
  using Block = x86::PanelBlock<kLanes, kBlockCost>;

  static void widen_row(const uint8_t* src, int64_t k, uint8_t* dst) {
    const __m256i low = _mm256_set1_epi32(0x0f0f0f0f);
    for (int64_t p = 0; p < k; p += 32) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + p / 2)));
      const __m256i bytes = _mm256_and_si256(_mm256_or_si256(w, _mm256_slli_epi32(w, 12)), low);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p), bytes);
    }
  }

  static void store(const Block& block, const float (*out)[kLanes], const float* a_scale, float* dst, int64_t ldc,
                    int nb) {
    x86::store_lane_sums<kLanes>(block, out, a_scale, dst, ldc, nb);
  }

  // A dword a row for one step, else qwords (steps / 2 a row); each quad's
  // bytes in widen_row's order.
  struct Gather {
    __m256i offsets, in;
    bool one_step;

    Gather(int64_t lda, const Block& block) : one_step(block.steps == 1) {
      alignas(32) int32_t dword_at[8], dword_in[8];
      alignas(32) int64_t qword_at[4], qword_in[4];
      for (int v = 0; v < 8 && one_step; ++v) {
        dword_at[v] = static_cast<int32_t>(v * lda);
        dword_in[v] = v < block.rows ? -1 : 0;
      }
      for (int v = 0, per_row = block.steps / 2; v < 4 && !one_step; ++v) {
        qword_at[v] = v / per_row * lda + v % per_row * 8;
        qword_in[v] = v / per_row < block.rows ? -1 : 0;
      }
      offsets = one_step ? _mm256_load_si256(reinterpret_cast<const __m256i*>(dword_at))
                         : _mm256_load_si256(reinterpret_cast<const __m256i*>(qword_at));
      in = one_step ? _mm256_load_si256(reinterpret_cast<const __m256i*>(dword_in))
                    : _mm256_load_si256(reinterpret_cast<const __m256i*>(qword_in));
    }
    static __m256i zero() { return _mm256_setzero_si256(); }
    static void store(__m256i sum, float* dst) { _mm256_store_ps(dst, _mm256_cvtepi32_ps(sum)); }
    __m256i line(const uint8_t* at, uint8_t* dst, __m256i sum) const {
      const __m256i order = _mm256_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15,
                                             0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
      const __m256i raw =
          one_step ? _mm256_mask_i32gather_epi32(zero(), reinterpret_cast<const int*>(at), offsets, in, 1)
                   : _mm256_mask_i64gather_epi64(zero(), reinterpret_cast<const long long*>(at), offsets, in, 1);
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst), _mm256_shuffle_epi8(raw, order));
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), raw);
      return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    }
  };

  // 4 * kSteps bytes of a widened row of b into each 4 * kSteps bytes of a vector.
  template <int kSteps>
  static MOE_X86_INLINE __m256i broadcast_b(const uint8_t* p) {
    if constexpr (kSteps == 1) {
      int32_t v;
      std::memcpy(&v, p, sizeof(v));
      return _mm256_set1_epi32(v);
    } else if constexpr (kSteps == 2) {
      int64_t v;
      std::memcpy(&v, p, sizeof(v));
      return _mm256_set1_epi64x(v);
    } else if constexpr (kSteps == 4) {
      return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    }
  }

  template <int kSteps>
  static void tile(const Block& block, const uint8_t* wb, int64_t k, int64_t group, int64_t groups,
                   const float* const* scale, const float* zero_scale, const x86::RowsAhead& ahead,
                   float (*out)[kLanes]) {
    constexpr int64_t kLineValues = 4 * kSteps;
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int q = 0; q < kCols; ++q) _mm256_store_ps(out[q], _mm256_setzero_ps());
    for (int64_t g = 0; g < groups; ++g) {
      ahead.fetch(g, group);
      __v8si acc[kCols];  // not __m256i: as avx512's S8, GCC 12 copies those around
      for (int q = 0; q < kCols; ++q) acc[q] = __v8si{};
      const int64_t end = k - g * group < group ? k : (g + 1) * group;
      const uint8_t* line = block.lines + g * group / kLineValues * kLineBytes;
      const uint8_t* end_line = block.lines + end / kLineValues * kLineBytes;
      for (const uint8_t* w = wb + g * group; line < end_line;) {
        __v16hi pairs[kCols];
        for (int q = 0; q < kCols; ++q) pairs[q] = __v16hi{};
        for (int t = 0; t < kInt16Lines && line < end_line; ++t, line += kLineBytes, w += kLineValues) {
          const __m256i values = _mm256_load_si256(reinterpret_cast<const __m256i*>(line));
          for (int q = 0; q < kCols; ++q) {
            pairs[q] += reinterpret_cast<__v16hi>(_mm256_maddubs_epi16(broadcast_b<kSteps>(w + q * k), values));
          }
        }
        for (int q = 0; q < kCols; ++q) {
          acc[q] += reinterpret_cast<__v8si>(_mm256_madd_epi16(reinterpret_cast<__m256i>(pairs[q]), ones16));
        }
      }
      const __m256 sums = _mm256_load_ps(block.sums + g * kLanes);
      for (int q = 0; q < kCols; ++q) {
        __m256 total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reinterpret_cast<__m256i>(acc[q])),
                                       _mm256_set1_ps(scale[q][g]), _mm256_load_ps(out[q]));
        total = _mm256_fnmadd_ps(_mm256_set1_ps(zero_scale[q * groups + g]), sums, total);
        _mm256_store_ps(out[q], total);
      }
    }
  }
};

void gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
               const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmW4A8);
  if (m >= kW4A8PanelRows) {
    x86::gemm_w4a8_panels<W4A8Panels>(m, n, k, a, lda, a_scale, b, ldb, groups, c, ldc);
    return;
  }
  const x86::W4A8Operands<kW4A8Step> ops(m, k, a, lda, groups.group, w4a8_prepare_row);
  W4A8Tiles t{{ops, a_scale, b, ldb, groups, c, ldc}};
  x86::gemm_tiled(t, m, n, k);
}

}  // namespace

const KernelSet& avx2::kernels() {
  static const KernelSet kernels = above(generic::kernels(), [](KernelSet& set) {
    row_kernels::compiled_here(set);
    set.gemm_f32 = gemm_f32;
    set.gemm_bf16 = gemm_bf16;
    set.gemm_s8 = gemm_s8;
    set.fp8_to_bf16 = fp8_to_bf16;
    set.fp8_to_f32 = fp8_to_f32;
    set.gemm_bf16_fp8 = gemm_bf16_fp8;
    set.gemm_bf16_fp8_takes = gemm_bf16_fp8_takes;
    set.gemm_w4a8 = gemm_w4a8;
    set.mxfp4_to_bf16 = mxfp4_to_bf16;
    set.mxfp4_to_f32 = mxfp4_to_f32;
    set.gemm_bf16_mxfp4 = gemm_bf16_mxfp4;
    set.gemm_bf16_mxfp4_takes = gemm_bf16_mxfp4_takes;
  });
  return kernels;
}

}  // namespace moe_xarch
