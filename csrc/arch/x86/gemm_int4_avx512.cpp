// The AVX-512 (F, BW, VL, DQ, VNNI) INT4_W4A8 kernels, also the avx512_bf16
// level's and, below gemm_amx.cpp's kW4A8TileRows rows of a, amx's. Both
// multiply the nibbles (unsigned) by a (signed) with vpdpbusd as they are, and
// take the zero points' part, zero * sum of a over the group, away per group.
//
// One row of a (the register kernel, decode's): a 64-byte load of b holds 128
// values, the even ones in its low nibbles and the odd ones in its high
// nibbles, so the row of a is first put in that order (per 128 values: the 64
// even, then the 64 odd). A 128-bit lane covers 32 values, within one group
// (groups are multiples of 32), so a step's int32 lanes turn into fp32 times
// their group's scale.
//
// More rows (the panel kernel, w4a8_panels.h): the lanes run across rows of
// a, as int8's line kernels run them across columns, so the int32 sums turn
// into fp32 once per group and column instead of once per 128 values of each
// row, which kept the register kernel at half int8's speed; each row of b
// widens into bytes as it lies, with no transpose.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "arch/x86/avx512_reduce.h"
#include "arch/x86/inline.h"
#include "arch/x86/kernels_x86.h"
#include "arch/x86/loop_nest.h"
#include "arch/x86/w4a8_operands.h"
#include "arch/x86/w4a8_panels.h"
#include "core/kernel_use.h"
#include "core/kernels.h"

namespace moe_xarch {
namespace {

constexpr int64_t kStepValues = 128;  // of K per step: one 64-byte load of b
constexpr int64_t kChunk = x86::kW4A8Chunk;

MOE_X86_INLINE __mmask64 first_bytes(int64_t count) {
  return count >= 64 ? ~__mmask64{0} : count <= 0 ? __mmask64{0} : (__mmask64{1} << count) - 1;
}

// A row of a in step order, with its chunk sums (x86::W4A8Operands): a byte
// shuffle puts each 16-byte lane's even values before its odd ones, a qword
// permute gathers the halves of two loads.
void w4a8_prepare_row(const int8_t* row, int64_t k, int8_t* dst, int32_t* chunk_sums) {
  const __m512i split = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m512i evens = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i odds = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  const __m512i first_of_lane = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t p = 0; p < k; p += kStepValues) {
    const __m512i x0 = _mm512_maskz_loadu_epi8(first_bytes(k - p), row + p);
    const __m512i x1 = _mm512_maskz_loadu_epi8(first_bytes(k - p - 64), row + p + 64);
    const __m512i s0 = _mm512_shuffle_epi8(x0, split), s1 = _mm512_shuffle_epi8(x1, split);
    _mm512_store_si512(dst + p, _mm512_permutex2var_epi64(s0, evens, s1));
    _mm512_store_si512(dst + p + 64, _mm512_permutex2var_epi64(s0, odds, s1));
    // Sums of 4 values an int32 lane, 8 lanes a chunk: chunk c's halves into lane c, then across it.
    const __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, x0);
    const __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, x1);
    __m512i v = _mm512_add_epi32(_mm512_shuffle_i64x2(d0, d1, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i64x2(d0, d1, _MM_SHUFFLE(3, 1, 3, 1)));
    v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
    v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(chunk_sums + p / kChunk),
                     _mm512_castsi512_si128(_mm512_permutexvar_epi32(first_of_lane, v)));
  }
}

// The register kernel: one row of a (the panels take more), 1 x kNR1 tiles
// whose rows of b, adjacent, are read one after another: one stream.
struct W4A8Tiles : x86::W4A8TileArgs<kStepValues> {
  static constexpr int kNR1 = 4;
  static constexpr bool kRowsInOrder = true;

  template <int MR, int NR>
  MOE_X86_INLINE void tile(int64_t i, const x86::TileCols& cols, int64_t /*p0*/, int64_t k, bool first) {
    static_assert(MR == 1, "more rows of a go to the panels");
    x86::w4a8_tile<MR, NR>(*this, i, cols, k, first);
  }

  // Row i of a times one row of b over all of K, lane-wise.
  // kOneGroup: K in spans of one group, whose scale is one value; otherwise
  // one span, each lane's scale its chunk's group's: the step's 4 chunks lie
  // in at most 4 groups from the first one's, whose scales one load and one
  // permute put in the lanes (a gather of 4 took longer on Zen 4).
  template <bool kOneGroup>
  MOE_X86_INLINE __m512 row_dot(int64_t i, const uint8_t* row, const float* scale, int64_t k) const {
    const __m512i chunk_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const int8_t* a = ops.a + i * ops.lda;
    __m512 sum = _mm512_setzero_ps();
    const int64_t span = kOneGroup ? groups.group : k;
    for (int64_t p0 = 0, g = 0; p0 < k; p0 += span, ++g) {
      const int64_t p1 = k - p0 < span ? k : p0 + span;
      // The step at p, reading the lanes' bytes of b (the last step may hold fewer).
      const auto step = [&](int64_t p, __mmask64 lanes) __attribute__((always_inline)) {
        // Into L2, as the fused MXFP4 GEMM's: into L1 was 0.84-0.95x on Zen 4.
        __builtin_prefetch(row + p / 2 + x86::kStreamAhead, 0, 2);
        const __m512i packed = _mm512_maskz_loadu_epi8(lanes, row + p / 2);
        const __m512i lo = _mm512_and_si512(packed, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
        __m512 step_scale;
        if constexpr (kOneGroup) {
          step_scale = _mm512_set1_ps(scale[g]);
        } else {
          const __m128i step_groups = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ops.chunk_group + p / kChunk));
          const int64_t first = _mm_cvtsi128_si32(step_groups);
          const auto reached =
              groups.ld - first >= 4 ? __mmask16{0xf} : static_cast<__mmask16>((1u << (groups.ld - first)) - 1);
          const __m512i lane_group = _mm512_permutexvar_epi32(
              chunk_of_lane,
              _mm512_zextsi128_si512(_mm_sub_epi32(step_groups, _mm_set1_epi32(static_cast<int32_t>(first)))));
          step_scale = _mm512_permutexvar_ps(lane_group, _mm512_maskz_loadu_ps(reached, scale + first));
        }
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(a + p));
        dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512(a + p + 64));
        sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), step_scale, sum);
      };
      int64_t p = p0;
      for (; p + kStepValues <= p1; p += kStepValues) step(p, ~__mmask64{0});
      if (p < p1) step(p, first_bytes((p1 - p) / 2));
    }
    return sum;
  }

  template <int MR, int NR, bool kOneGroup>
  MOE_X86_INLINE void run(int64_t i, const x86::TileCols& cols, int64_t k, bool /*first*/) {
    const x86::W4A8Columns<NR> col(b, ldb, groups, cols);
    col.prefetch_groups(cols.ahead, groups.ld);
    __m512 acc[NR];
    for (int q = 0; q < NR; ++q) acc[q] = row_dot<kOneGroup>(i, col.b[q], col.scale[q], k);
    // The zero points' part, lane-wise by group: the lanes are summed below anyway.
    const int64_t group_count = k / groups.group;
    for (int64_t g = 0; g < group_count; g += 16) {
      const __mmask16 in = group_count - g >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (group_count - g)) - 1);
      const __m512 sums = _mm512_load_ps(ops.group_sums + i * ops.sums_ld + g);
      for (int q = 0; q < NR; ++q) {
        const __m512 zero = col.zero[q] == nullptr
                                ? _mm512_set1_ps(static_cast<float>(x86::kW4A8DefaultZero))
                                : _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(in, col.zero[q] + g)));
        const __m512 zero_scale = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, col.scale[q] + g), zero);
        acc[q] = _mm512_fnmadd_ps(zero_scale, sums, acc[q]);
      }
    }
    __m512 out[NR];
    for (int q = 0; q < NR; ++q) out[q] = _mm512_mul_ps(acc[q], _mm512_set1_ps(a_scale[i]));
    x86::store_cols<NR>(c + i * ldc + cols.j, cols, false,
                        [&](float* dst, bool) { x86::store_sums_avx512<NR>(out, dst, cols.nb, false); });
  }
};

// The panel kernel from this many rows of a: with fewer, its widening of b
// would cost more than the register kernel's decode in registers.
constexpr int64_t kPanelRows = 2;

// w4a8_panels.h's operations with 16 lanes and 64-byte lines.
struct Panels {
  static constexpr int kLanes = 16;
  static constexpr int kCols = 8;  // 8 chains of vpdpbusd; 12 or two blocks of rows measured slower
  static constexpr int kBlockCost = 2;
  static constexpr int64_t kLineBytes = 4 * kLanes;
  using Block = x86::PanelBlock<kLanes, kBlockCost>;

  // 64 values of a quad's bytes: (w | w << 12) & 0x0f0f0f0f per 16-bit word w.
  static MOE_X86_INLINE __m512i widen_words(__m256i words) {
    const __m512i w = _mm512_cvtepu16_epi32(words);
    return _mm512_ternarylogic_epi32(w, _mm512_slli_epi32(w, 12), _mm512_set1_epi32(0x0f0f0f0f), 0xa8);  // (A | B) & C
  }

  // Whole 64-byte lines of src without masks, then the last 32 to 96 values.
  static void widen_row(const uint8_t* src, int64_t k, uint8_t* dst) {
    int64_t p = 0;
    for (; p + 128 <= k; p += 128) {
      const __m256i* line = reinterpret_cast<const __m256i*>(src + p / 2);
      _mm512_storeu_si512(dst + p, widen_words(_mm256_loadu_si256(line)));
      _mm512_storeu_si512(dst + p + 64, widen_words(_mm256_loadu_si256(line + 1)));
    }
    for (; p < k; p += 64) {
      const __mmask16 words = k - p >= 64 ? __mmask16{0xffff} : __mmask16{0xff};
      _mm512_mask_storeu_epi32(dst + p, words, widen_words(_mm256_maskz_loadu_epi16(words, src + p / 2)));
    }
  }

  // Rows that fill the lanes (one step): a column's 16 sums are its 16 rows of
  // c, scattered; the scalar stores took a tenth of the kernel at M = 512.
  static void store(const Block& block, const float (*out)[kLanes], const float* a_scale, float* dst, int64_t ldc,
                    int nb) {
    if (block.steps != 1) {
      x86::store_lane_sums<kLanes>(block, out, a_scale, dst, ldc, nb);
      return;
    }
    const auto rows = static_cast<__mmask16>((1u << block.rows) - 1);
    const __m512 scale = _mm512_maskz_loadu_ps(rows, a_scale);
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(static_cast<int32_t>(ldc)));
    for (int q = 0; q < nb; ++q) {
      _mm512_mask_i32scatter_ps(dst + q, rows, at, _mm512_mul_ps(_mm512_load_ps(out[q]), scale), 4);
    }
  }

  // A dword a row for one step, else qwords (steps / 2 a row); each quad's
  // bytes in widen_row's order.
  struct Gather {
    __m512i offsets;
    __mmask16 dwords = 0;
    __mmask8 qwords = 0;
    bool one_step;

    Gather(int64_t lda, const Block& block) : one_step(block.steps == 1) {
      if (one_step) {
        offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                     _mm512_set1_epi32(static_cast<int32_t>(lda)));
        dwords = static_cast<__mmask16>((1u << block.rows) - 1);
      } else {
        const int per_row = block.steps / 2;
        alignas(64) int64_t at[8];
        for (int v = 0; v < 8; ++v) {
          at[v] = v / per_row * lda + v % per_row * 8;
          if (v / per_row < block.rows) qwords = static_cast<__mmask8>(qwords | (1u << v));
        }
        offsets = _mm512_load_si512(at);
      }
    }
    static __m512i zero() { return _mm512_setzero_si512(); }
    static void store(__m512i sum, float* dst) { _mm512_store_ps(dst, _mm512_cvtepi32_ps(sum)); }
    __m512i line(const uint8_t* at, uint8_t* dst, __m512i sum) const {
      const __m512i order =
          _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15));
      const __m512i raw = one_step ? _mm512_mask_i32gather_epi32(zero(), dwords, offsets, at, 1)
                                   : _mm512_mask_i64gather_epi64(zero(), qwords, offsets, at, 1);
      _mm512_store_si512(dst, _mm512_shuffle_epi8(raw, order));
      return _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(1), raw);
    }
  };

  // 4 * kSteps bytes of a widened row of b into each 4 * kSteps bytes of a vector.
  template <int kSteps>
  static MOE_X86_INLINE __m512i broadcast_b(const uint8_t* p) {
    if constexpr (kSteps == 1) {
      int32_t v;
      __builtin_memcpy(&v, p, sizeof(v));
      return _mm512_set1_epi32(v);
    } else if constexpr (kSteps == 2) {
      int64_t v;
      __builtin_memcpy(&v, p, sizeof(v));
      return _mm512_set1_epi64(v);
    } else if constexpr (kSteps == 4) {
      return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else {
      return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
  }

  template <int kSteps>
  static void tile(const Block& block, const uint8_t* wb, int64_t k, int64_t group, int64_t groups,
                   const float* const* scale, const float* zero_scale, const x86::RowsAhead& ahead,
                   float (*out)[kLanes]) {
    using Acc = __v16si;  // not __m512i: gemm_avx512.cpp's S8 says why
    constexpr int64_t kLineValues = 4 * kSteps;
    __m512 total[kCols];
    for (int q = 0; q < kCols; ++q) total[q] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      ahead.fetch(g, group);
      Acc acc[kCols];
      for (int q = 0; q < kCols; ++q) acc[q] = Acc{};
      const int64_t end = k - g * group < group ? k : (g + 1) * group;
      const uint8_t* line = block.lines + g * group / kLineValues * kLineBytes;
      const uint8_t* end_line = block.lines + end / kLineValues * kLineBytes;
      for (const uint8_t* w = wb + g * group; line < end_line; line += kLineBytes, w += kLineValues) {
        const __m512i values = _mm512_load_si512(line);
        for (int q = 0; q < kCols; ++q) {
          acc[q] = reinterpret_cast<Acc>(
              _mm512_dpbusd_epi32(reinterpret_cast<__m512i>(acc[q]), broadcast_b<kSteps>(w + q * k), values));
        }
      }
      const __m512 sums = _mm512_load_ps(block.sums + g * kLanes);
      for (int q = 0; q < kCols; ++q) {
        total[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reinterpret_cast<__m512i>(acc[q])),
                                   _mm512_set1_ps(scale[q][g]), total[q]);
        total[q] = _mm512_fnmadd_ps(_mm512_set1_ps(zero_scale[q * groups + g]), sums, total[q]);
      }
    }
    for (int q = 0; q < kCols; ++q) _mm512_store_ps(out[q], total[q]);
  }
};

}  // namespace

void avx512::gemm_w4a8(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                       const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  MOE_KERNEL_USE(kGemmW4A8);
  if (m >= kPanelRows) {
    x86::gemm_w4a8_panels<Panels>(m, n, k, a, lda, a_scale, b, ldb, groups, c, ldc);
    return;
  }
  const x86::W4A8Operands<kStepValues> ops(m, k, a, lda, groups.group, w4a8_prepare_row);
  W4A8Tiles t{{ops, a_scale, b, ldb, groups, c, ldc}};
  x86::stream_rows(t, n, k, t.row_bytes());
}

}  // namespace moe_xarch
