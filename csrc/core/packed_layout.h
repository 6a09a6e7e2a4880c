// The packed weight layouts, described once; core/packed_layout.cpp writes
// them (convert_weight_packed), the kernels read them.
//
// A packed tensor is uint8 [E, packed_nbytes(rows, cols, dtype, method)]: per expert a
// 64-byte self-describing header (core/packing.h), then its values in one
// layout, then, for int8, the int32 row sums of x86's unsigned*signed VNNI path.
//
// - Rows (PackLayout::kRows): each row padded with zeros to a multiple of
//   kPackAlign values and aligned to kPackAlign bytes, so kernels run tail-free.
// - Tiles, for a level with tile GEMMs (KernelSet::tiles names the layout it
//   reads), where the row count allows the layout's blocks (tiles_apply): runs
//   of blocks of TileShape::rows rows, ld values a row, each block a run of
//   lines, line q holding bytes [c q, c q + c) of K (c: TileShape::chunk) of
//   each row of the block in turn (tile_byte).
//   * PackLayout::kTiles16, the avx512_bf16 and amx levels': 16 rows of 4-byte
//     chunks, for bf16, int8 and fp8 where the row count is a multiple of 32
//     (so the driver's row blocks, and the up half of w1, start on 16-row
//     blocks). 16 lines are an AMX tile, and AVX-512 streams a block as one run.
//     fp8 takes the line layout instead (fp8_line_byte): line q holds values
//     [4 q, 4 q + 4) of K of each of the 16 rows, and widens into two rows of a
//     bf16 tile; each 16 bytes hold 4 rows, their first pairs of values in the
//     low 8 bytes and their second pairs in the high 8, so the byte interleave
//     that widens them stays within 128-bit lanes.
//   * PackLayout::kTiles2, the i8mm level's: 2 rows of 8-byte chunks, for bf16
//     and int8 where the row count is a multiple of 4 (so the up half of w1
//     starts on a pair): each 16 bytes are one SMMLA or BFMMLA operand.
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

// The header's layout field (core/packing.h).
enum class PackLayout : int32_t { kRows = 0, kTiles16 = 1, kTiles2 = 2 };

// A tile layout's blocks: `rows` rows, interleaved in chunks of `chunk` bytes.
struct TileShape {
  int64_t rows;
  int64_t chunk;
};

constexpr TileShape kTiles16Shape{16, 4};
constexpr TileShape kTiles2Shape{2, 8};

// Packed weight rows and the driver's activation buffers are padded to this
// many elements and aligned to this many bytes.
inline constexpr int64_t kPackAlign = 64;

namespace {

// Byte x of K of row r of a block of a tile layout sits at byte:
// coverage: begin unreachable (tile-levels)
constexpr int64_t tile_byte(TileShape shape, int64_t r, int64_t x) {
  return x / shape.chunk * shape.rows * shape.chunk + r * shape.chunk + x % shape.chunk;
}
// coverage: end

// Value p of row r of a block in the fp8 line layout sits at byte:
// coverage: begin unreachable (x86-fp8)
// coverage: begin unreachable (tile-levels)
constexpr int64_t fp8_line_byte(int64_t r, int64_t p) {
  return p / 4 * 64 + r / 4 * 16 + p % 4 / 2 * 8 + r % 4 * 2 + p % 2;
}
// coverage: end

// Row r of a 16-row block in the line layout, its first cols values, into dst.
// coverage: begin unreachable (x86-fp8)
// coverage: begin unreachable (tile-levels)
inline void fp8_line_row(const uint8_t* block, int64_t r, int64_t cols, uint8_t* dst) {
  for (int64_t p = 0; p < cols; ++p) dst[p] = block[fp8_line_byte(r, p)];
}
// coverage: end

}  // namespace
}  // namespace moe_xarch
