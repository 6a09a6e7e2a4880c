// INT4_W4A8's operands as the avx2 and AVX-512 kernels read them, ISA-neutral
// (gemm_int4_avx512.cpp says why this form): rows of a in step order (per
// kStep values of K: the even ones, then the odd ones, zero-padded to whole
// steps), their sums per group, and the group of each 32-value chunk. In an
// anonymous namespace (loop_nest.h says why); no C++ library headers.
#pragma once

#include "arch/x86/loop_nest.h"
#include "core/kernels.h"
#include "core/scratch.h"

namespace moe_xarch::x86 {
namespace {

constexpr int64_t kW4A8Chunk = 32;     // values of K in a 128-bit lane of a step: within one group
constexpr int64_t kW4A8SumsPad = 16;   // group sums a row, a multiple of every level's fp32 lanes
constexpr int kW4A8DefaultZero = 8;    // the zero point of groups without zeros

// a prepared once for every call on the same rows (thread_prepared_rows).
// PrepareRow(row, k, dst, chunk_sums) writes the row's lda step-ordered bytes
// (zeros past k) and the sums of its 32-value chunks, one int32 each up to lda
// (kernels.h: k is a multiple of 32).
template <int64_t kStep>
struct W4A8Operands {
  int64_t lda, sums_ld;
  int8_t* a;
  float* group_sums;     // [m, sums_ld]: sum of row i of a over group g, zero from k / group on
  int32_t* chunk_group;  // [lda / 32 + 4]: the group of chunk t, the last one past k

  template <class PrepareRow>
  W4A8Operands(int64_t m, int64_t k, const int8_t* a_rows, int64_t a_ld, int64_t group, PrepareRow prepare_row)
      : lda((k + kStep - 1) / kStep * kStep),
        sums_ld((k / group + kW4A8SumsPad - 1) / kW4A8SumsPad * kW4A8SumsPad) {
    const int64_t a_bytes = m * lda, sums_bytes = m * sums_ld * 4;
    const int64_t chunks = lda / kW4A8Chunk, table_bytes = (chunks + 4) * 4;
    const PreparedRows prepared =
        thread_prepared_rows(ScratchUse::kInt4Groups, a_bytes + sums_bytes + 2 * table_bytes, a_rows, m, k);
    uint8_t* scratch = prepared.data;
    a = reinterpret_cast<int8_t*>(scratch);
    group_sums = reinterpret_cast<float*>(scratch + a_bytes);
    chunk_group = reinterpret_cast<int32_t*>(scratch + a_bytes + sums_bytes);
    if (prepared.ready) return;
    int32_t* chunk_sums = reinterpret_cast<int32_t*>(scratch + a_bytes + sums_bytes + table_bytes);
    const int64_t groups = k / group, chunks_per_group = group / kW4A8Chunk;
    for (int64_t t = 0, g = 0, in_group = 0; t < chunks + 4; ++t) {
      chunk_group[t] = static_cast<int32_t>(g < groups ? g : groups - 1);
      if (++in_group == chunks_per_group) in_group = 0, ++g;
    }
    for (int64_t i = 0; i < m; ++i) {
      prepare_row(a_rows + i * a_ld, k, a + i * lda, chunk_sums);
      float* sums = group_sums + i * sums_ld;
      for (int64_t g = 0; g < sums_ld; ++g) {
        int32_t sum = 0;
        for (int64_t t = 0; g < groups && t < chunks_per_group; ++t) sum += chunk_sums[g * chunks_per_group + t];
        sums[g] = static_cast<float>(sum);
      }
    }
  }
};

// What a level's W4A8 tiles read and write, whatever its vector width.
template <int64_t kStepValues>
struct W4A8TileArgs {
  static constexpr int64_t kStep = kStepValues;  // values of K per vector step
  using T = uint8_t;
  static constexpr int64_t kKBlock = 0;

  const W4A8Operands<kStepValues>& ops;
  const float* a_scale;
  const uint8_t* b;
  int64_t ldb;
  const Int4Groups& groups;
  float* c;
  int64_t ldc;

  int64_t row_bytes() const { return ldb; }
};

// A level's W4A8Tiles::tile (loop_nest.h): its run<MR, NR, kOneGroup> for
// the tile's K, kOneGroup when each step lies in one group.
template <int MR, int NR, class Tiles>
MOE_X86_INLINE void w4a8_tile(Tiles& t, int64_t i, const TileCols& cols, int64_t k, bool first) {
  if (t.groups.group % Tiles::kStep == 0) {
    t.template run<MR, NR, true>(i, cols, k, first);
  } else {
    t.template run<MR, NR, false>(i, cols, k, first);
  }
}

// A W4A8 tile's NR rows of b with their group scales and zero points (null:
// the default); past the edge the last repeats (as TileRows).
template <int NR>
struct W4A8Columns {
  const uint8_t* b[NR];
  const float* scale[NR];
  const uint8_t* zero[NR];
  W4A8Columns(const uint8_t* b0, int64_t ldb, const Int4Groups& groups, const TileCols& cols) {
    for (int q = 0; q < NR; ++q) {
      const int64_t j = cols.at(q);
      b[q] = b0 + j * ldb;
      scale[q] = groups.scale + j * groups.ld;
      zero[q] = groups.zero != nullptr ? groups.zero + j * groups.ld : nullptr;
    }
  }

  // A streaming tile's prefetch (as TileRows') of the group scales and zeros
  // `ahead` rows on: a few bytes a group, in rows that a strided tile visits
  // out of order, which the hardware prefetcher does not follow.
  void prefetch_groups(int64_t ahead, int64_t ld) const {
    for (int q = 0; q < NR; ++q) {
      for (int64_t g = 0; g < ld; g += 16) __builtin_prefetch(scale[q] + ahead * ld + g, 0, 3);
      if (zero[q] != nullptr) {
        for (int64_t g = 0; g < ld; g += 64) __builtin_prefetch(zero[q] + ahead * ld + g, 0, 3);
      }
    }
  }
};

}  // namespace
}  // namespace moe_xarch::x86
