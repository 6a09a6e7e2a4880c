#include "core/packing.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/checked.h"
#include "core/kernel_use.h"
#include "core/kernels.h"
#include "core/methods.h"
#include "core/packed_layout.h"
#include "core/stable_torch.h"
#include "moe_xarch.h"

namespace moe_xarch {
namespace {

// Where a packed tensor may start: any multiple of the widest word read from
// it (fp32 values, int32 row sums), so views into a mapped file work.
constexpr uintptr_t kPackedAddressAlign = 4;

constexpr char kMagic[8] = {'M', 'O', 'E', 'K', 'P', 'A', 'C', 'K'};
// What a layout's bytes mean. Bump it with any change to that, so older packs
// are refused, not misread.
constexpr uint32_t kVersion = 4;

const char* arch_name(uint32_t arch) {
  switch (static_cast<PackArch>(arch)) {
    case PackArch::kX86_64: return "x86_64";
    case PackArch::kAarch64: return "aarch64";
    case PackArch::kGeneric: return "generic";
  }
  return "unknown";
}

// FNV-1a of the header's fields before the checksum.
uint64_t header_checksum(const PackedHeader& header) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(&header);
  uint64_t hash = 0xcbf29ce484222325u;
  for (size_t i = 0; i < offsetof(PackedHeader, checksum); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3u;
  return hash;
}

// The header of a block of rows x cols values, or nothing if its size does not fit int64.
std::optional<PackedHeader> make_header(int64_t rows, int64_t cols, ScalarType dtype, PackArch arch,
                                        PackLayout layout = PackLayout::kRows) {
  const int64_t elem = element_size(dtype);
  const Size ld = Size(cols).round_up(kPackAlign);
  const std::optional<int64_t> values_end = (Size(kPackedHeaderBytes) + Size(rows) * ld * elem).get();
  if (!values_end) return std::nullopt;
  PackedHeader header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kVersion;
  header.arch = static_cast<uint32_t>(arch);
  header.dtype = static_cast<int32_t>(dtype);
  header.layout = static_cast<int32_t>(layout);
  header.rows = rows;
  header.cols = cols;
  header.ld = *ld.get();
  header.sums_offset = dtype == kChar ? *values_end : 0;
  header.checksum = header_checksum(header);
  return header;
}

// The bytes of a block with this header, or nothing if they do not fit int64.
std::optional<int64_t> block_nbytes(const PackedHeader& header, ScalarType dtype) {
  const Size values_end = Size(kPackedHeaderBytes) + Size(header.rows) * header.ld * element_size(dtype);
  const Size end = header.sums_offset ? values_end + Size(header.rows) * int64_t{sizeof(int32_t)} : values_end;
  return end.round_up(kPackAlign).get();
}

// The dtype a weight of dtype `given` packs under for a method: its own, or,
// for 4-bit weights (rows of bytes), the method's 4-bit dtype. `op` names the
// caller in errors.
ScalarType packed_dtype(ScalarType given, int64_t moe_comp_method, const char* op) {
  const Method method = check_method(moe_comp_method);
  const ScalarType dtype = four_bit_dtype(method) != kUndefined && given == kByte ? four_bit_dtype(method) : given;
  if (method == Method::kUnquant) {
    MOE_XARCH_CHECK(dtype == kBFloat16 || dtype == kHalf || dtype == kFloat, op,
                    ": weight for UNQUANT must be bfloat16, float16 or float32, got ", dtype);
  } else {
    const ScalarType expected = weight_dtype(method, kFloat);
    MOE_XARCH_CHECK(given == expected, op, ": weight for ", method_name(moe_comp_method), " must be ", expected,
                    ", got ", given);
  }
  return dtype;
}

int64_t expert_nbytes(int64_t rows, int64_t cols, ScalarType dtype, const char* op) {
  MOE_XARCH_CHECK(rows > 0 && cols > 0, op, ": rows and cols must be positive, got ", rows, " and ", cols);
  const std::optional<PackedHeader> header = make_header(rows, cols, dtype, PackArch::kGeneric);
  const std::optional<int64_t> nbytes = header ? block_nbytes(*header, dtype) : std::nullopt;
  MOE_XARCH_CHECK(nbytes, op, ": rows x cols = ", rows, " x ", cols, " values of ", dtype,
                  " take more than 2^63 bytes");
  return *nbytes;
}

// Packed weights are streamed start to end by every call, from memory once
// they outgrow the last level cache: on 2 MiB pages a stream takes a TLB
// entry per 2 MiB, not per 4 KiB. Advice for the whole pages inside
// [data, data + bytes), given before they are first written. The allocator
// may hand back memory it had mapped before, 4 KiB at a time: those pages
// are dropped (the tensor is new, nothing in it to keep) and come back huge
// on the first write. A kernel without transparent huge pages ignores the
// advice, and so do we.
void advise_huge_pages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const auto start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (start + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (start + static_cast<uintptr_t>(bytes)) & ~(kHugePage - 1);
  if (end > begin && madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) == 0) {
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }
#endif
}

}  // namespace

int64_t packed_nbytes(int64_t rows, int64_t cols, ScalarType dtype, int64_t moe_comp_method) {
  return expert_nbytes(rows, cols, packed_dtype(dtype, moe_comp_method, "packed_nbytes"), "packed_nbytes");
}

Tensor pack_weights(const Tensor& weight, int64_t moe_comp_method, PackArch arch, PackLayout tiles) {
  check_method(moe_comp_method);
  MOE_XARCH_CHECK(weight.dim() == 3, "convert_weight_packed: weight must be 3-D [E, rows, cols], got ",
                  weight.dim(), "-D");
  MOE_XARCH_CHECK(weight.is_contiguous(), "convert_weight_packed: weight must be contiguous");
  const ScalarType dtype = packed_dtype(weight.scalar_type(), moe_comp_method, "convert_weight_packed");
  const int64_t experts = weight.size(0), rows = weight.size(1), cols = weight.size(2);
  MOE_XARCH_CHECK(rows > 0 && cols > 0, "convert_weight_packed: weight must be [E, rows, cols] (w1 [E, 2N, K] or w2 "
                  "[E, K, N]) with rows > 0 and cols > 0, got shape ", Shape{weight.sizes()});
  const int64_t block_bytes = expert_nbytes(rows, cols, dtype, "convert_weight_packed");
  Tensor packed = torch::stable::empty({experts, block_bytes}, kByte, std::nullopt, weight.device());
  const PackLayout layout = tiles_apply(tiles, rows, dtype) ? tiles : PackLayout::kRows;
  counting::count(layout == PackLayout::kRows ? counting::Kind::kPackRows : counting::Kind::kPackTiles,
                  counting::kCoreLevel);
  const PackedHeader header = make_header(rows, cols, dtype, arch, layout).value();  // sized above
  const int64_t elem = element_size(dtype);
  const auto* src = static_cast<const uint8_t*>(weight.data_ptr());
  auto* dst = packed.mutable_data_ptr<uint8_t>();
  advise_huge_pages(dst, experts * block_bytes);
  parallel_for(0, experts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      uint8_t* block = dst + e * block_bytes;
      std::memset(block, 0, block_bytes);
      std::memcpy(block, &header, sizeof(header));
      write_expert(src + e * rows * cols * elem, header, block);
    }
  });
  return packed;
}

PackedHeader check_packed(const Tensor& packed, const char* name, PackArch arch, PackLayout tiles) {
  MOE_XARCH_CHECK(packed.scalar_type() == kByte && packed.dim() == 2 && packed.size(0) > 0 &&
                  packed.size(1) >= kPackedHeaderBytes,
                  "fused_experts_cpu: ", name,
                  " with is_vnni=True must come from convert_weight_packed (a uint8 [E, nbytes] "
                  "tensor), got ", packed.scalar_type(), " of shape ", Shape{packed.sizes()});
  MOE_XARCH_CHECK(packed.is_contiguous(), "fused_experts_cpu: ", name, " must be contiguous");
  const auto* base = packed.const_data_ptr<uint8_t>();
  PackedHeader header;
  std::memcpy(&header, base, sizeof(header));
  MOE_XARCH_CHECK(std::memcmp(header.magic, kMagic, sizeof(kMagic)) == 0, "fused_experts_cpu: ", name,
                  " with is_vnni=True did not come from convert_weight_packed (no packed header)");
  MOE_XARCH_CHECK(header.version == kVersion, "fused_experts_cpu: ", name, " was packed in format version ",
                  header.version, ", which this build does not read (it reads version ", kVersion,
                  "); repack it with this build's convert_weight_packed");
  MOE_XARCH_CHECK(header.checksum == header_checksum(header), "fused_experts_cpu: ", name,
                  " has a corrupt packed header (its checksum does not match: the header changed after "
                  "convert_weight_packed wrote it)");
  MOE_XARCH_CHECK(header.arch == static_cast<uint32_t>(arch), "fused_experts_cpu: ", name,
                  " was packed on ", arch_name(header.arch), "; repack it on this machine (",
                  arch_name(static_cast<uint32_t>(arch)), ") with convert_weight_packed");
  const auto dtype = static_cast<ScalarType>(header.dtype);
  MOE_XARCH_CHECK(dtype == kBFloat16 || dtype == kHalf || dtype == kFloat ||
                  dtype == kChar || dtype == kFloat8_e4m3fn || is_four_bit(dtype),
                  "fused_experts_cpu: ", name, " has a corrupt packed header (value type)");
  const auto layout = static_cast<PackLayout>(header.layout);
  MOE_XARCH_CHECK(layout == PackLayout::kRows || tiles_apply(layout, header.rows, dtype),
                  "fused_experts_cpu: ", name, " has a corrupt packed header (layout)");
  MOE_XARCH_CHECK(layout == PackLayout::kRows || layout == tiles, "fused_experts_cpu: ", name, " was packed in ",
                  layout_description(layout, dtype), ", which this kernel level does not read; repack it with "
                  "convert_weight_packed under the level that uses it (MOE_XARCH_ISA)");
  // Every field as convert_weight_packed would write it, and the size it implies
  // (computed without wrapping) that of the tensor.
  const std::optional<PackedHeader> expected =
      header.rows > 0 && header.cols > 0 ? make_header(header.rows, header.cols, dtype, arch, layout) : std::nullopt;
  const std::optional<int64_t> nbytes = expected ? block_nbytes(*expected, dtype) : std::nullopt;
  MOE_XARCH_CHECK(nbytes, "fused_experts_cpu: ", name, " has a corrupt packed header: it claims ", header.rows,
                  " rows x ", header.cols, " values, which no tensor holds");
  MOE_XARCH_CHECK(std::memcmp(&header, &*expected, sizeof(header)) == 0, "fused_experts_cpu: ", name,
                  " has a corrupt packed header: its fields are not those of ", header.rows, " rows x ", header.cols,
                  " values");
  MOE_XARCH_CHECK(packed.size(1) == *nbytes, "fused_experts_cpu: ", name, " has ", packed.size(1),
                  " bytes per expert, but its packed header's ", header.rows, " rows x ", header.cols,
                  " values take ", *nbytes, "; pass the whole tensor convert_weight_packed returned");
  const auto address = reinterpret_cast<uintptr_t>(packed.const_data_ptr());
  MOE_XARCH_CHECK(address % kPackedAddressAlign == 0, "fused_experts_cpu: ", name, " starts at an address ",
                  address % kPackedAddressAlign, " bytes past a multiple of ", kPackedAddressAlign,
                  " (its values and row sums are read as words of up to 4 bytes); pass ", name, ".clone()");
  return header;
}

void check_packed_expert(const Tensor& packed, const char* name, int64_t expert) {
  const auto* base = packed.const_data_ptr<uint8_t>();
  MOE_XARCH_CHECK(std::memcmp(base + expert * packed.size(1), base, sizeof(PackedHeader)) == 0, "fused_experts_cpu: ",
                  name, " expert ", expert, " does not carry the same packed header as expert 0");
}

PackedView packed_expert(const Tensor& packed, int64_t expert) {
  const uint8_t* block = packed.const_data_ptr<uint8_t>() + expert * packed.size(1);
  PackedHeader header;
  std::memcpy(&header, block, sizeof(header));
  return PackedView{block + kPackedHeaderBytes,
                    header.sums_offset ? reinterpret_cast<const int32_t*>(block + header.sums_offset)
                                       : nullptr,
                    header.ld};
}

}  // namespace moe_xarch
