#include "core/packed_layout.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "core/packing.h"

namespace moe_xarch {
namespace {

// fp8 rows into the line layout (fp8_line_byte), blocks of 16 rows row_bytes a
// row as in store_tiles.
// coverage: begin unreachable (x86-fp8)
// coverage: begin unreachable (tile-levels)
void store_fp8_lines(const uint8_t* src, int64_t rows, int64_t cols, int64_t row_bytes, uint8_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* block = dst + (r / 16) * 16 * row_bytes;
    for (int64_t p = 0; p < cols; ++p) block[fp8_line_byte(r % 16, p)] = src[r * cols + p];
  }
}
// coverage: end

// Each block of shape.rows rows of src (cols values of elem bytes a row) into
// the tile layout (tile_byte), row_bytes (>= cols * elem) a row.
// coverage: begin unreachable on x86_64 unless avx512_bf16 or amx ran (tile-levels): the x86 tile and line
//   layouts are read by the avx512_bf16 and amx levels alone (KernelSet::tiles): this CPU has neither
void store_tiles(TileShape shape, const uint8_t* src, int64_t rows, int64_t cols, int64_t elem, int64_t row_bytes,
                 uint8_t* dst) {
  const int64_t col_bytes = cols * elem;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* block = dst + (r / shape.rows) * shape.rows * row_bytes;
    const uint8_t* row = src + r * col_bytes;
    for (int64_t x = 0; x < col_bytes; x += shape.chunk) {
      std::memcpy(block + tile_byte(shape, r % shape.rows, x), row + x,
                  static_cast<size_t>(std::min(shape.chunk, col_bytes - x)));
    }
  }
}
// coverage: end

}  // namespace

bool tiles_apply(PackLayout tiles, int64_t rows, ScalarType dtype) {
  if (tiles == PackLayout::kTiles16) {
    // coverage: unreachable (x86-fp8)
    // coverage: unreachable (tile-levels)
    return (dtype == kBFloat16 || dtype == kChar || dtype == kFloat8_e4m3fn) && rows % 32 == 0;
  }
  if (tiles == PackLayout::kTiles2) return (dtype == kBFloat16 || dtype == kChar) && rows % 4 == 0;
  return false;
}

// coverage: begin unreachable (tile-levels)
const char* layout_description(PackLayout tiles, ScalarType dtype) {
  if (tiles == PackLayout::kTiles2) return "the row-pair tile layout of the i8mm level";
  // coverage: begin unreachable (x86-fp8)
  return dtype == kFloat8_e4m3fn ? "the line layout of the avx512_bf16 and amx levels"
                                     : "the tile layout of the avx512_bf16 and amx levels";
  // coverage: end
}
// coverage: end

void write_expert(const uint8_t* src, const PackedHeader& header, uint8_t* block) {
  const auto dtype = static_cast<ScalarType>(header.dtype);
  const int64_t rows = header.rows, cols = header.cols, elem = element_size(dtype);
  uint8_t* values = block + kPackedHeaderBytes;
  const auto layout = static_cast<PackLayout>(header.layout);
  if (layout == PackLayout::kTiles16 && dtype == kFloat8_e4m3fn) {
    // coverage: unreachable (x86-fp8)
    // coverage: unreachable (tile-levels)
    store_fp8_lines(src, rows, cols, header.ld, values);
  } else if (layout != PackLayout::kRows) {
    // coverage: begin unreachable (tile-levels)
    store_tiles(layout == PackLayout::kTiles16 ? kTiles16Shape : kTiles2Shape, src, rows, cols, elem,
                header.ld * elem, values);
    // coverage: end
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(values + r * header.ld * elem, src + r * cols * elem, cols * elem);
    }
  }
  if (header.sums_offset) {
    auto* sums = reinterpret_cast<int32_t*>(block + header.sums_offset);
    const auto* s8 = reinterpret_cast<const int8_t*>(src);
    for (int64_t r = 0; r < rows; ++r) {
      int32_t sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += s8[r * cols + c];
      sums[r] = sum;
    }
  }
}

}  // namespace moe_xarch
