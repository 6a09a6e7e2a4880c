// The packed weight layout made by convert_weight_packed (is_vnni=True).
//
// A packed tensor is uint8 [E, packed_nbytes(rows, cols, dtype)]. Each expert's
// block starts with a 64-byte header that makes it self-describing, so that a
// tensor which did not come from convert_weight_packed, came from another
// architecture or was altered since (the header's checksum), is refused
// instead of read as garbage. After the header: the
// rows, each padded with zeros to a multiple of kPackAlign values and aligned
// to kPackAlign bytes (kernels run tail-free on them); for int8, the int32 row
// sums that x86's unsigned*signed VNNI path needs. A level with tile GEMMs
// (KernelSet::gemm_bf16_tiles) gets its bf16 and int8 values in their tile
// layout instead, and fp8 in the line layout (kernels.h), once, where the row
// count is a multiple of 32 (so the driver's row blocks, and the up half of
// w1, start on 16-row blocks); the header says which, and a level that cannot
// read it refuses the tensor.
//
// 4-bit weights (INT4_W4A8, MXFP4) pack the same on every architecture: their
// rows of bytes as the spec lays them out (byte j of a row: value 2j in the low
// nibble, 2j + 1 in the high), each padded with zero bytes to a multiple of
// kPackAlign bytes; the header's cols counts bytes and its dtype is the
// method's 4-bit dtype (methods.h), so a pack for one method is refused by
// the other. Kernels read such rows up to the logical width only: a zero
// nibble is not a zero value for either method.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace moe_xarch {

enum class PackArch : uint32_t { kGeneric = 0, kX86_64 = 1, kAarch64 = 2 };

enum class PackLayout : int32_t { kRows = 0, kTiles16 = 1 };

struct PackedHeader {
  char magic[8];
  uint32_t version;
  uint32_t arch;       // PackArch of the machine that packed it
  int32_t dtype;       // c10::ScalarType of the values
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

// In the tile layout where it applies if `tiles` (the running level reads it:
// KernelSet::reads_tiles).
at::Tensor pack_weights(const at::Tensor& weight, int64_t moe_comp_method, PackArch arch, bool tiles);

// Checks that `packed` (the argument called `name`) came from
// convert_weight_packed on this architecture, in a layout the running level
// reads (`tiles`: KernelSet::reads_tiles), and returns its header: expert 0's.
PackedHeader check_packed(const at::Tensor& packed, const char* name, PackArch arch, bool tiles);

// Checks that an expert of a checked packed tensor carries expert 0's header.
// Each header is a cache miss, so a call checks the experts it reads: a decode
// call reads a few of them (checking all 64 took ~30 us of a 1.7 ms call).
void check_packed_expert(const at::Tensor& packed, const char* name, int64_t expert);

PackedView packed_expert(const at::Tensor& packed, int64_t expert);

}  // namespace moe_xarch
