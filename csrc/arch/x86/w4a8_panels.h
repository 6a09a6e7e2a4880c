// INT4_W4A8's panel kernel, ISA-neutral (gemm_int4_avx512.cpp says why this
// form): the lanes of a vector run across rows of a, so a group's int32 sums
// turn into fp32 once per group and column of c. a's rows go into a panel
// once for the calls on the same rows (thread_prepared_rows), in blocks of
// kLanes rows, the rest in blocks of a power of two rows with `steps` quads of
// K each, so that the rows fill the lanes (PanelBlock::rows_from); each row
// of b widens into bytes, a quad of K (one 16-bit word of b: values
// 4 t .. 4 t + 3) into the bytes of
// (w | w << 12) & 0x0f0f0f0f, which is values 4 t, 4 t + 2, 4 t + 1,
// 4 t + 3 (the panel's bytes take the same order), and 4 * steps bytes of it
// at a time meet a line of the panel. In an anonymous namespace (loop_nest.h
// says why); no C++ library headers.
//
// A level's Panels brings:
//   kLanes, kCols         int32 lanes of a vector; columns of c a register tile
//   kBlockCost            a block's own work (per group of K, its lanes'
//                         scaling; its stores) in rows' worth of lines
//   Block                 PanelBlock<kLanes, kBlockCost>
//   widen_row(src, k, dst)
//                         k values of a row of b into k bytes
//   Gather(lda, block)    gathers a line of the block from its rows of a:
//                         line(at, dst, sum) stores the line of the rows' bytes
//                         from `at` on into dst and returns sum plus its lanes'
//                         sums; zero() and store(sum, dst) the sums' vector
//   tile<kSteps>(block, wb, k, group, groups, scale, zero_scale, ahead, out)
//                         kCols widened rows (wb, k bytes apart) against the
//                         block over all of K into out[q][lane], calling
//                         ahead.fetch(g, group) as group g starts
//   store(block, out, a_scale, dst, ldc, nb)
//                         out into c's nb columns from dst (row block.row0),
//                         as store_lane_sums does; a_scale from the block's row
#pragma once

#include "arch/x86/inline.h"
#include "arch/x86/w4a8_operands.h"
#include "core/kernels.h"
#include "core/scratch.h"

namespace moe_xarch::x86 {
namespace {

// Quads of K a line of the panel holds of each row, at most: a broadcast of
// 32 bytes of widened b.
constexpr int kMaxSteps = 8;

// A block of a's panel: `rows` rows from row0, in lines of `steps` quads of
// K of each row (lane r * steps + u: quad s * steps + u of row r), with the
// lanes' sums per group ([group][lane], fp32). Every block takes the scratch
// of a full one, so block ib's lies at ib * bytes(k, groups).
template <int kLanes, int kBlockCost>
struct PanelBlock {
  int64_t row0;
  int rows;
  int steps;
  uint8_t* lines;
  float* sums;

  PanelBlock(int64_t first_row, int block_rows, int64_t ib, int64_t k, int64_t groups, uint8_t* scratch)
      : row0(first_row), rows(block_rows), steps(kLanes / room(block_rows)) {
    lines = scratch + ib * bytes(k, groups);
    sums = reinterpret_cast<float*>(lines + kLanes * k);
  }
  static int64_t bytes(int64_t k, int64_t groups) { return kLanes * k + groups * kLanes * 4; }

  // The rows a block of `rows` holds lanes for: the least power of two >= rows,
  // and at least kLanes / kMaxSteps. Its lines cost in proportion.
  static constexpr int room(int rows) {
    int held = kLanes / kMaxSteps;
    while (held < rows) held *= 2;
    return held;
  }

  // The greatest power of two <= rows.
  static constexpr int whole_part(int rows) {
    int whole = 1;
    while (2 * whole <= rows) whole *= 2;
    return whole;
  }

  // What the rows left at the end of a (fewer than kLanes) cost, split into
  // blocks the cheapest way: each block its room, plus kBlockCost rows'
  // worth for its per-group scaling and its stores.
  static constexpr int cost(int rows) {
    if (rows == 0) return 0;
    const int whole = whole_part(rows);
    const int one = room(rows) + kBlockCost;
    const int split = whole == rows ? one : room(whole) + kBlockCost + cost(rows - whole);
    return one < split ? one : split;
  }

  // The rows of the block that starts with `left` rows of a to go: kLanes,
  // else all of them, or the greatest power of two below, where fewer lanes
  // go empty that way (9 rows: 8 and 1, not 16 lanes for 9).
  static int rows_from(int64_t left) {
    if (left >= kLanes) return kLanes;
    const int rows = static_cast<int>(left);
    return room(rows) + kBlockCost == cost(rows) ? rows : whole_part(rows);
  }

  // f(block) for each block of a's m rows, in order.
  template <class F>
  static void each(int64_t m, int64_t k, int64_t groups, uint8_t* scratch, F f) {
    for (int64_t row0 = 0, ib = 0; row0 < m; ++ib) {
      const PanelBlock block(row0, rows_from(m - row0), ib, k, groups, scratch);
      f(block);
      row0 += block.rows;
    }
  }
  static int64_t count(int64_t m) {
    int64_t blocks = 0;
    for (int64_t row0 = 0; row0 < m; ++blocks) row0 += rows_from(m - row0);
    return blocks;
  }
};

// The rows of b that the next columns of c widen, fetched while the first
// block of rows runs, two groups of K of each row as each group starts, so
// that all of them are on their way by the block's half: rows of b come from
// memory once, and fetched all at once they would wait on the line fill
// buffers. Into L2: in L1 they pushed out the panel's lines and widened b,
// which the block reads.
struct RowsAhead {
  const uint8_t* first = nullptr;
  int64_t ldb = 0;
  int64_t row_bytes = 0;
  int rows = 0;  // 0: none (the last columns, or a later block of rows)

  MOE_X86_INLINE void fetch(int64_t g, int64_t group) const {
    const int64_t end = (g + 1) * group < row_bytes ? (g + 1) * group : row_bytes;
    for (int64_t at = g * group; at < end; at += 64) {
      for (int q = 0; q < rows; ++q) __builtin_prefetch(first + q * ldb + at, 0, 2);
    }
  }
};

// The block's rows of a into its lines, and the lanes' sums per group.
template <class Panels>
void pack_block(const int8_t* a, int64_t lda, int64_t k, int64_t group, const typename Panels::Block& block) {
  const typename Panels::Gather gather(lda, block);
  const auto* base = reinterpret_cast<const uint8_t*>(a + block.row0 * lda);
  const int64_t line_values = 4 * block.steps;
  uint8_t* line = block.lines;
  float* sums = block.sums;
  for (int64_t p0 = 0; p0 < k; p0 += group, sums += Panels::kLanes) {
    const int64_t end = k - p0 < group ? k : p0 + group;
    auto sum = Panels::Gather::zero();
    for (int64_t p = p0; p < end; p += line_values, line += 4 * Panels::kLanes) sum = gather.line(base + p, line, sum);
    Panels::Gather::store(sum, sums);
  }
}

// c's nb columns from dst, rows [0, block.rows): each row's lanes of out
// summed, times the row's a scale. Scalar, for a level with no faster store.
template <int kLanes, class Block>
void store_lane_sums(const Block& block, const float (*out)[kLanes], const float* a_scale, float* dst,
                     int64_t ldc, int nb) {
  for (int r = 0; r < block.rows; ++r) {
    for (int q = 0; q < nb; ++q) {
      float sum = 0.f;
      for (int u = 0; u < block.steps; ++u) sum += out[q][r * block.steps + u];
      dst[r * ldc + q] = sum * a_scale[r];
    }
  }
}

template <class Panels>
void gemm_w4a8_panels(int64_t m, int64_t n, int64_t k, const int8_t* a, int64_t lda, const float* a_scale,
                      const uint8_t* b, int64_t ldb, const Int4Groups& groups, float* c, int64_t ldc) {
  constexpr int kLanes = Panels::kLanes, kCols = Panels::kCols;
  using Block = typename Panels::Block;
  const int64_t count = (k + groups.group - 1) / groups.group;
  const PreparedRows prepared =
      thread_prepared_rows(ScratchUse::kPanels, Block::count(m) * Block::bytes(k, count), a, m, k);
  uint8_t* panel = prepared.data;
  if (!prepared.ready) {
    Block::each(m, k, count, panel, [&](const Block& block) { pack_block<Panels>(a, lda, k, groups.group, block); });
  }
  uint8_t* wb = thread_scratch(ScratchUse::kInt4Groups, kCols * (k + count * 4));
  auto* zero_scale = reinterpret_cast<float*>(wb + kCols * k);
  alignas(64) float out[kCols][kLanes];
  for (int64_t j = 0; j < n; j += kCols) {
    const int nb = n - j < kCols ? static_cast<int>(n - j) : kCols;
    const float* scale[kCols];
    for (int q = 0; q < kCols; ++q) {
      const int64_t row = j + (q < nb ? q : nb - 1);  // past n, the last again (not stored)
      Panels::widen_row(b + row * ldb, k, wb + q * k);
      scale[q] = groups.scale + row * groups.ld;
      for (int64_t g = 0; g < count; ++g) {
        const int zero = groups.zero != nullptr ? groups.zero[row * groups.ld + g] : kW4A8DefaultZero;
        zero_scale[q * count + g] = scale[q][g] * static_cast<float>(zero);
      }
    }
    const int64_t after = n - j - kCols;
    const RowsAhead next_rows =
        after > 0 ? RowsAhead{b + (j + kCols) * ldb, ldb, k / 2, after < kCols ? static_cast<int>(after) : kCols}
                  : RowsAhead{};
    Block::each(m, k, count, panel, [&](const Block& block) {
      const RowsAhead ahead = block.row0 == 0 ? next_rows : RowsAhead{};
      switch (block.steps) {
        case 1: Panels::template tile<1>(block, wb, k, groups.group, count, scale, zero_scale, ahead, out); break;
        case 2: Panels::template tile<2>(block, wb, k, groups.group, count, scale, zero_scale, ahead, out); break;
        case 4: Panels::template tile<4>(block, wb, k, groups.group, count, scale, zero_scale, ahead, out); break;
        default: Panels::template tile<8>(block, wb, k, groups.group, count, scale, zero_scale, ahead, out); break;
      }
      Panels::store(block, out, a_scale + block.row0, c + block.row0 * ldc + j, ldc, nb);
    });
  }
}

}  // namespace
}  // namespace moe_xarch::x86
