// The packed weights of convert_weight_packed (is_vnni=True; layouts in
// core/packed_layout.h). Each expert's block starts with a 64-byte header so
// that a tensor not from convert_weight_packed, from another architecture, in
// a layout the running level cannot read, or altered since (its checksum) is
// refused instead of read as garbage.
#pragma once

#include <cstdint>

#include "core/packed_layout.h"
#include "core/stable_torch.h"

namespace moe_xarch {

enum class PackArch : uint32_t { kGeneric = 0, kX86_64 = 1, kAarch64 = 2 };

struct PackedHeader {
  char magic[8];
  uint32_t version;
  uint32_t arch;       // PackArch of the machine that packed it
  int32_t dtype;       // the values' ScalarType (torch's numbering)
  int32_t layout;      // PackLayout
  int64_t rows;
  int64_t cols;
  int64_t ld;          // padded row length, in values
  int64_t sums_offset; // bytes from the block start to the int32 row sums; 0 if none
  uint64_t checksum;   // of the fields above: one flipped bit of any of them is refused
};
static_assert(sizeof(PackedHeader) == 64, "the header must fit its 64 bytes");

inline constexpr int64_t kPackedHeaderBytes = 64;

// One expert's block of a validated packed tensor.
struct PackedView {
  const uint8_t* values;
  const int32_t* row_sums;  // null unless int8
  int64_t ld;
};

// In `tiles`, the tile layout the running level reads (KernelSet::tiles), where
// it applies; kRows: rows.
Tensor pack_weights(const Tensor& weight, int64_t moe_comp_method, PackArch arch, PackLayout tiles);

// Checks that `packed` (the argument called `name`) came from
// convert_weight_packed on this architecture, in a layout the running level
// reads (rows, or `tiles`: KernelSet::tiles), and returns its header: expert 0's.
PackedHeader check_packed(const Tensor& packed, const char* name, PackArch arch, PackLayout tiles);

// Checks that an expert of a checked packed tensor carries expert 0's header.
// Each header is a cache miss, so a call checks only the experts it reads.
void check_packed_expert(const Tensor& packed, const char* name, int64_t expert);

PackedView packed_expert(const Tensor& packed, int64_t expert);

// The layouts' writers (core/packed_layout.cpp). Whether the tile layout
// `tiles` (kTiles16 for fp8: the line layout) applies to a weight of `rows`
// rows of `dtype`:
bool tiles_apply(PackLayout tiles, int64_t rows, ScalarType dtype);

// A tile layout's name (kTiles16's for fp8: the line layout) and the levels
// that read it, for errors.
const char* layout_description(PackLayout tiles, ScalarType dtype);

// One expert's rows x cols values (src, unpadded) into its zeroed block
// after the header, in the header's layout, with its row sums if it has them.
void write_expert(const uint8_t* src, const PackedHeader& header, uint8_t* block);

}  // namespace moe_xarch
