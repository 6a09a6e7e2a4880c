// The packed weight layouts, described once; core/packed_layout.cpp writes
// them (convert_weight_packed), the kernels read them.
//
// A packed tensor is uint8 [E, packed_nbytes(rows, cols, dtype)]: per expert a
// 64-byte self-describing header (core/packing.h), then its values in one
// layout, then, for int8, the int32 row sums of x86's unsigned*signed VNNI path.
//
// - Rows (PackLayout::kRows): each row padded with zeros to a multiple of
//   kPackAlign values and aligned to kPackAlign bytes, so kernels run tail-free.
// - Tiles (PackLayout::kTiles16), for a level with tile GEMMs
//   (KernelSet::reads_tiles), where the row count is a multiple of 32 (so the
//   driver's row blocks, and the up half of w1, start on 16-row blocks):
//   * bf16 and int8, the tile layout (tile_byte): each 16-row block, ld values
//     a row, is a run of 64-byte lines, line q holding bytes [4 q, 4 q + 4) of
//     K of each of its 16 rows in turn: 16 lines are an AMX tile, and AVX-512
//     streams a block as one run.
//   * fp8, the line layout (fp8_line_byte): line q holds values [4 q, 4 q + 4)
//     of K of each of the 16 rows, and widens into two rows of a bf16 tile;
//     each 16 bytes hold 4 rows, their first pairs of values in the low 8
//     bytes and their second pairs in the high 8, so the byte interleave that
//     widens them stays within 128-bit lanes.
// - 4-bit weights (INT4_W4A8, MXFP4): rows only, alike on every architecture
//   and level, each row its bytes as the spec lays them out (byte j: value 2j
//   in the low nibble, 2j + 1 in the high) padded with zero bytes as above.
//   The header's cols counts bytes and its dtype is the method's 4-bit dtype
//   (core/methods.h), so a pack for one method is refused by the other.
//   Kernels read such rows up to the logical width only: a zero nibble is not
//   a zero value for either method.
//
// Included by files compiled with ISA flags: no C++ library headers, and
// internal linkage, so that no level's copy of a function serves another.
#pragma once

#include <cstdint>

namespace moe_xarch {

// Packed weight rows and the driver's activation buffers are padded to this
// many elements and aligned to this many bytes.
inline constexpr int64_t kPackAlign = 64;

namespace {

// Byte x of K of row r of a 16-row block in the tile layout sits at byte:
constexpr int64_t tile_byte(int64_t r, int64_t x) { return x / 4 * 64 + r * 4 + x % 4; }

// Value p of row r of a block in the fp8 line layout sits at byte:
constexpr int64_t fp8_line_byte(int64_t r, int64_t p) {
  return p / 4 * 64 + r / 4 * 16 + p % 4 / 2 * 8 + r % 4 * 2 + p % 2;
}

// Row r of a 16-row block in the line layout, its first cols values, into dst.
inline void fp8_line_row(const uint8_t* block, int64_t r, int64_t cols, uint8_t* dst) {
  for (int64_t p = 0; p < cols; ++p) dst[p] = block[fp8_line_byte(r, p)];
}

}  // namespace
}  // namespace moe_xarch
