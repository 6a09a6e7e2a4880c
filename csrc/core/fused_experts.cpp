// The architecture-neutral fused MoE driver (see the spec for the math).
//
// Phases, each parallel over independent work items:
//   0. route: a counting sort of the (token, slot) pairs by expert;
//   1. gather each routed token row into the GEMM's input type (bf16, fp32, or
//      int8 quantized per token), rows padded with zeros to kPackAlign;
//   2. per (expert, block of N): h = x @ W1^T + b1, activation -> intermediate;
//      (INT8: the intermediate is re-quantized per row);
//   3. per block of K, for every expert: y = a @ W2^T + b2, times the routing
//      weight, added to its token's fp32 row: no atomics, a fixed order;
//   4. per token: cast its row once into the output.
// Each phase is a range named moe_xarch::<phase> in torch.profiler.
#include "core/fused_experts.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/checked.h"
#include "core/work_sharing.h"

namespace moe_xarch {
namespace {

constexpr int64_t kTokenChunk = 128;  // rows of a per GEMM call: bounds the fp32 tile buffers
// Activation columns per phase-2 work item: 128 rows of gate and of up,
// which a tile-layout GEMM streams 4 blocks of 16 side by side at a time
// (measured alone at 2 threads: ~32 GB/s against ~29 for 2 blocks); 128
// rather than 64 made int8 decode 0.5-3.6% faster, bf16 the same.
constexpr int64_t kInterBlock = 128;
constexpr int64_t kHiddenBlock = 128;  // output columns per phase-3 work item

// The phases as consecutive torch.profiler ranges: each ends where the next
// begins, the last with the call. Costs a thread-local check when no
// profiler is on.
class PhaseRanges {
 public:
  void begin(const char* name) {
    range_.reset();
    range_.emplace(at::RecordScope::FUNCTION);
    if (range_->isActive()) range_->before(name);
  }

 private:
  std::optional<at::RecordFunction> range_;
};

int64_t round_up(int64_t value, int64_t multiple) { return ceil_div(value, multiple) * multiple; }

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// Bytes of memory this machine has; no one buffer of a call may need more.
int64_t machine_memory_bytes() {
  static const int64_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (Size(pages) * page).get().value_or(INT64_MAX) : INT64_MAX;
  }();
  return bytes;
}

// rows x width values, 64-byte aligned, for `what` (which names the arguments
// its size comes from): a size that does not fit int64 or the machine's memory,
// or an allocation that fails, is an error that says so, not a crash.
template <typename T>
std::unique_ptr<T[], AlignedFree> aligned_buffer(int64_t rows, int64_t width, const char* what) {
  const std::optional<int64_t> bytes = (Size(std::max<int64_t>(rows, 1)) * width * int64_t{sizeof(T)})
                                           .round_up(kPackAlign).get();
  const int64_t memory = machine_memory_bytes();
  TORCH_CHECK(bytes && *bytes <= memory, "fused_experts_cpu: ", what, " needs ", rows, " rows of ", width,
              " values of ", sizeof(T), " bytes (", bytes ? std::to_string(*bytes >> 20) + " MiB" : "over 2^63 bytes",
              "), more than this machine's ", memory >> 20, " MiB of memory");
  T* data = static_cast<T*>(std::aligned_alloc(kPackAlign, std::max<int64_t>(*bytes, kPackAlign)));
  TORCH_CHECK(data, "fused_experts_cpu: ", what, " needs ", rows, " rows of ", width, " values of ", sizeof(T),
              " bytes (", *bytes >> 20, " MiB), which could not be allocated");
  return std::unique_ptr<T[], AlignedFree>(data);
}

uint16_t to_bf16_bits(float value) { return c10::BFloat16(value).x; }

// The routed (token, slot) pairs sorted by expert, stable in token order.
struct Routing {
  std::vector<int64_t> expert_begin;  // E + 1 offsets into the sorted slots
  std::vector<int64_t> token;         // token row of each sorted slot
  std::vector<float> weight;

  int64_t slots() const { return static_cast<int64_t>(token.size()); }
};

Routing route(const MoeProblem& p) {
  const int64_t* ids = p.topk_ids.data_ptr<int64_t>();
  const float* weights = p.topk_weights.data_ptr<float>();
  const int64_t pairs = p.tokens * p.topk;
  Routing r;
  r.expert_begin.assign(p.experts + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    if (ids[i] >= 0) ++r.expert_begin[ids[i] + 1];
  }
  for (int64_t e = 0; e < p.experts; ++e) r.expert_begin[e + 1] += r.expert_begin[e];
  const int64_t slots = r.expert_begin[p.experts];
  r.token.resize(slots);
  r.weight.resize(slots);
  std::vector<int64_t> next(r.expert_begin.begin(), r.expert_begin.end() - 1);
  for (int64_t i = 0; i < pairs; ++i) {
    if (ids[i] < 0) continue;
    const int64_t s = next[ids[i]]++;
    r.token[s] = i / p.topk;
    r.weight[s] = weights[i];
  }
  return r;
}

// A GEMM's left operand: `rows` rows of `ld` values in the compute type, zero
// padded past the logical width; per-row scales for int8.
struct Activations {
  ComputeType compute;
  QuantizeRowFn quantize_row_s8;
  int64_t ld = 0;
  std::unique_ptr<uint16_t[], AlignedFree> bf16;
  std::unique_ptr<float[], AlignedFree> f32;
  std::unique_ptr<int8_t[], AlignedFree> s8;
  std::unique_ptr<float[], AlignedFree> scale;

  // `what` names the rows and the arguments their number and width come from.
  Activations(const KernelSet& kernels, ComputeType compute, int64_t rows, int64_t width, const char* what)
      : compute(compute), quantize_row_s8(kernels.quantize_row_s8), ld(round_up(width, kPackAlign)) {
    switch (compute) {
      case ComputeType::kBF16: bf16 = aligned_buffer<uint16_t>(rows, ld, what); break;
      case ComputeType::kF32: f32 = aligned_buffer<float>(rows, ld, what); break;
      case ComputeType::kInt8:
        s8 = aligned_buffer<int8_t>(rows, ld, what);
        scale = aligned_buffer<float>(rows, 1, what);
        break;
    }
  }

  // Stores one fp32 row (width values) at `row`, converting and padding.
  void store_row(int64_t row, const float* values, int64_t width) {
    switch (compute) {
      case ComputeType::kBF16: {
        uint16_t* dst = bf16.get() + row * ld;
        for (int64_t i = 0; i < width; ++i) dst[i] = to_bf16_bits(values[i]);
        std::fill(dst + width, dst + ld, uint16_t{0});
        break;
      }
      case ComputeType::kF32: {
        float* dst = f32.get() + row * ld;
        std::copy(values, values + width, dst);
        std::fill(dst + width, dst + ld, 0.f);
        break;
      }
      case ComputeType::kInt8: {
        int8_t* dst = s8.get() + row * ld;
        quantize_row_s8(width, values, dst, scale.get() + row);
        std::fill(dst + width, dst + ld, int8_t{0});
        break;
      }
    }
  }

  // Row `row` of `from` (same compute type and width) into row `row` here.
  void copy_row(int64_t row, const Activations& from, int64_t from_row) {
    switch (compute) {
      case ComputeType::kBF16: std::memcpy(&bf16[row * ld], &from.bf16[from_row * ld], ld * sizeof(uint16_t)); break;
      case ComputeType::kF32: std::memcpy(&f32[row * ld], &from.f32[from_row * ld], ld * sizeof(float)); break;
      case ComputeType::kInt8:
        std::memcpy(&s8[row * ld], &from.s8[from_row * ld], ld);
        scale[row] = from.scale[from_row];
        break;
    }
  }
};

void load_row_f32(const at::Tensor& x, int64_t row, float* out) {
  const int64_t k = x.size(1);
  switch (x.scalar_type()) {
    case at::kFloat: std::memcpy(out, x.const_data_ptr<float>() + row * k, k * sizeof(float)); break;
    case at::kBFloat16: {
      const auto* src = x.const_data_ptr<c10::BFloat16>() + row * k;
      for (int64_t i = 0; i < k; ++i) out[i] = static_cast<float>(src[i]);
      break;
    }
    default: {
      const auto* src = x.const_data_ptr<c10::Half>() + row * k;
      for (int64_t i = 0; i < k; ++i) out[i] = static_cast<float>(src[i]);
      break;
    }
  }
}

// One thread's scratch for a work item: widened weight tiles, the fp32 GEMM
// output tiles and a row of activated values.
struct Scratch {
  std::unique_ptr<float[], AlignedFree> weights_f32;
  std::unique_ptr<uint16_t[], AlignedFree> weights_bf16;
  std::unique_ptr<float[], AlignedFree> out0, out1;
  std::vector<float> activated;
};

// Rows [r0, r1) of one expert's weight, in the form a GEMM kernel takes.
struct WeightTile {
  const uint8_t* values;
  int64_t ld;
  int64_t k;  // dot length: padded operands (packed rows, widened tiles) run tail-free
  int64_t rows;
  const int32_t* row_sums;     // INT8, may be null
  const float* channel_scale;  // INT8
  bool fp8 = false;            // raw fp8 values for gemm_bf16_fp8, with these scales
  Fp8Scales fp8_scales{};
  bool tiles = false;          // bf16 or int8 values in the tile layout, fp8 in the line layout
  bool w4a8 = false;           // INT4 values for gemm_w4a8, with these groups
  Int4Groups groups{};
};

// Multiplies activation rows by tiles of expert weights: c[i * tile.rows + j], fp32.
class ExpertGemm {
 public:
  ExpertGemm(const KernelSet& kernels, const MoeProblem& p, const WeightOperand& w, ComputeType compute)
      : kernels_(kernels), p_(p), w_(w), compute_(compute) {}

  // Rows [r0, r1) of expert e, for its m activation rows. fp16 and fp8 weights
  // are widened into scratch rows [slot, slot + r1 - r0) once, for every token
  // chunk that uses them; a_ld is the activations' padded width.
  WeightTile tile(int64_t expert, int64_t r0, int64_t r1, int64_t m, int64_t a_ld, Scratch& scratch,
                  int64_t slot) const {
    int64_t ld = 0;
    const int32_t* row_sums = nullptr;
    const uint8_t* base = w_.expert_rows(expert, &ld, &row_sums);
    const int64_t elem = c10::elementSize(w_.dtype);
    WeightTile t{base + r0 * ld * elem, ld, w_.packed ? a_ld : w_.cols, r1 - r0,
                 row_sums ? row_sums + r0 : nullptr,
                 w_.channel_scale ? w_.channel_scale + expert * w_.rows + r0 : nullptr};
    t.tiles = w_.tiles;
    if (w_.dtype == at::kQUInt4x2) {  // read as it is: groups end at the logical width
      t.k = w_.cols;
      t.w4a8 = true;
      const int64_t first = (expert * w_.rows + r0) * w_.scale_cols;
      t.groups = {w_.group_scale + first, w_.group_zero ? w_.group_zero + first : nullptr, w_.scale_cols, w_.group};
      return t;
    }
    // fp8 in the line layout goes to gemm_bf16_fp8_tiles whatever m: it has no rows to widen.
    if (w_.dtype == at::kFloat8_e4m3fn && compute_ == ComputeType::kBF16 && kernels_.gemm_bf16_fp8 &&
        (w_.tiles || m <= kernels_.gemm_bf16_fp8_rows)) {
      // The logical width: block scales end there, padding or not.
      t.k = w_.cols;
      t.fp8 = true;
      t.fp8_scales = {w_.block_scale + expert * w_.scale_rows * w_.scale_cols, w_.scale_cols, r0, p_.block_n,
                      p_.block_k};
    } else if (dequantizes()) {
      // Allocated on first use: a level that widens fp8 in its GEMM never needs it.
      if (compute_ == ComputeType::kBF16) {
        if (!scratch.weights_bf16) scratch.weights_bf16 = aligned_buffer<uint16_t>(kMaxTileRows, a_ld, kWidenedRows);
        uint16_t* out = scratch.weights_bf16.get() + slot * a_ld;
        widen_rows(base, ld, expert, r0, r1, a_ld, out, kernels_.fp8_to_bf16, kernels_.mxfp4_to_bf16, to_bf16_bits);
        t.values = reinterpret_cast<const uint8_t*>(out);
      } else {
        if (!scratch.weights_f32) scratch.weights_f32 = aligned_buffer<float>(kMaxTileRows, a_ld, kWidenedRows);
        float* out = scratch.weights_f32.get() + slot * a_ld;
        widen_rows(base, ld, expert, r0, r1, a_ld, out, kernels_.fp8_to_f32, kernels_.mxfp4_to_f32,
                   [](float v) { return v; });
        t.values = reinterpret_cast<const uint8_t*>(out);
      }
      t.ld = t.k = a_ld;
    }
    return t;
  }

  // The `m` activation rows starting at `row` times the tile.
  void run(const Activations& a, int64_t row, int64_t m, const WeightTile& w, float* c) const {
    if (w.k == 0) {  // N = 0: empty dot products, which the kernels are never given (kernels.h)
      std::fill(c, c + m * w.rows, 0.f);
      return;
    }
    switch (compute_) {
      case ComputeType::kInt8:
        if (w.w4a8) {
          kernels_.gemm_w4a8(m, w.rows, w.k, a.s8.get() + row * a.ld, a.ld, a.scale.get() + row, w.values, w.ld,
                             w.groups, c, w.rows);
          break;
        }
        (w.tiles ? kernels_.gemm_s8_tiles : kernels_.gemm_s8)(
            m, w.rows, w.k, a.s8.get() + row * a.ld, a.ld, a.scale.get() + row,
            reinterpret_cast<const int8_t*>(w.values), w.ld, w.channel_scale, w.row_sums, c, w.rows);
        break;
      case ComputeType::kBF16:
        if (w.fp8) {
          (w.tiles ? kernels_.gemm_bf16_fp8_tiles : kernels_.gemm_bf16_fp8)(
              m, w.rows, w.k, a.bf16.get() + row * a.ld, a.ld, w.values, w.ld, w.fp8_scales, c, w.rows);
          break;
        }
        (w.tiles ? kernels_.gemm_bf16_tiles : kernels_.gemm_bf16)(
            m, w.rows, w.k, a.bf16.get() + row * a.ld, a.ld, reinterpret_cast<const uint16_t*>(w.values), w.ld, c,
            w.rows);
        break;
      case ComputeType::kF32:
        kernels_.gemm_f32(m, w.rows, w.k, a.f32.get() + row * a.ld, a.ld,
                          reinterpret_cast<const float*>(w.values), w.ld, c, w.rows);
        break;
    }
  }

  // Rows of weight values one thread's scratch holds.
  static constexpr int64_t kMaxTileRows = std::max(2 * kInterBlock, kHiddenBlock);
  static constexpr const char* kWidenedRows = "a thread's widened weight rows (of K or N values)";

  // fp16, fp8 and MXFP4 weights are widened tile by tile into scratch before the GEMM.
  bool dequantizes() const {
    return w_.dtype == at::kHalf || w_.dtype == at::kFloat8_e4m3fn || w_.dtype == at::kFloat4_e2m1fn_x2;
  }

  // One thread's scratch: the output tiles (tile() adds weight tiles if it widens).
  Scratch scratch() const {
    Scratch s;
    s.out0 = aligned_buffer<float>(kTokenChunk, kMaxTileRows, "a GEMM output tile");
    s.out1 = aligned_buffer<float>(kTokenChunk, kMaxTileRows, "a GEMM output tile");
    s.activated.resize(kMaxTileRows);
    return s;
  }

 private:
  // fp16 rows (converted here), fp8 rows (times their block scales, by the
  // kernel set) or MXFP4 rows (likewise) into a zero-padded tile.
  template <typename T, typename Fp8Row, typename Mxfp4Row, typename Convert>
  void widen_rows(const uint8_t* base, int64_t ld, int64_t expert, int64_t r0, int64_t r1, int64_t ld_out,
                  T* out, Fp8Row fp8_row, Mxfp4Row mxfp4_row, Convert convert) const {
    const int64_t cols = w_.cols;
    std::vector<uint8_t> tiled_row(w_.tiles ? cols : 0);
    for (int64_t r = r0; r < r1; ++r) {
      T* dst = out + (r - r0) * ld_out;
      if (w_.dtype == at::kFloat4_e2m1fn_x2) {
        mxfp4_row(cols, base + r * ld, w_.mx_scale + (expert * w_.rows + r) * w_.scale_cols, dst);
      } else if (w_.dtype == at::kHalf) {
        const auto* src = reinterpret_cast<const c10::Half*>(base) + r * ld;
        for (int64_t c = 0; c < cols; ++c) dst[c] = convert(static_cast<float>(src[c]));
      } else {
        const float* scales = w_.block_scale + (expert * w_.scale_rows + r / p_.block_n) * w_.scale_cols;
        const uint8_t* row = base + r * ld;
        if (w_.tiles) {  // fp8 for fp32 compute: gather the row out of its 16-row block first
          fp8_line_row(base + r / 16 * 16 * ld, r % 16, cols, tiled_row.data());
          row = tiled_row.data();
        }
        fp8_row(cols, row, scales, p_.block_k, dst);
      }
      std::fill(dst + cols, dst + ld_out, T{0});
    }
  }

  const KernelSet& kernels_;
  const MoeProblem& p_;
  const WeightOperand& w_;
  ComputeType compute_;
};

// Phase 2 epilogue: bias, activation, store of `m` rows of one column block
// (gate and up in scratch.out0 and out1, or interleaved in out0).
void activate_block(const KernelSet& kernels, const MoeProblem& p, int64_t expert, int64_t j0, int64_t j1,
                    int64_t m, Scratch& scratch, Activations& inter,
                    int64_t first_row, float* inter_f32) {
  const int64_t width = j1 - j0;
  // Without a bias, a block of zeros stands in for it.
  std::array<float, 2 * kInterBlock> no_bias{};
  const float* bias = p.w1.bias ? p.w1.bias + expert * 2 * p.inter : nullptr;
  const bool halves = p.activation == Activation::kSiluAndMul;
  const float* bias0 = bias ? bias + (halves ? j0 : 2 * j0) : no_bias.data();
  const float* bias1 = bias ? bias + p.inter + j0 : no_bias.data();
  const float limit = p.limit.value_or(std::numeric_limits<float>::infinity());
  const float* out0 = scratch.out0.get();
  const float* out1 = scratch.out1.get();
  std::vector<float>& row = scratch.activated;
  float* out = row.data();
  for (int64_t i = 0; i < m; ++i) {
    if (halves) {
      kernels.silu_and_mul(width, out0 + i * width, out1 + i * width, bias0, bias1, out);
    } else {
      kernels.swiglu(width, out0 + i * 2 * width, bias0, p.alpha, limit, out);
    }
    const int64_t s = first_row + i;
    if (inter_f32) {
      std::copy(row.begin(), row.begin() + width, inter_f32 + s * inter.ld + j0);
    } else if (inter.compute == ComputeType::kBF16) {
      for (int64_t j = 0; j < width; ++j) inter.bf16[s * inter.ld + j0 + j] = to_bf16_bits(row[j]);
    } else {
      std::copy(row.begin(), row.begin() + width, inter.f32.get() + s * inter.ld + j0);
    }
  }
}

struct WorkItem {
  int64_t expert;
  int64_t begin;  // first column of the block
};

std::vector<WorkItem> work_items(const Routing& routing, int64_t experts, int64_t width, int64_t block) {
  std::vector<WorkItem> items;
  for (int64_t e = 0; e < experts; ++e) {
    if (routing.expert_begin[e] == routing.expert_begin[e + 1]) continue;
    for (int64_t j = 0; j < width; j += block) items.push_back({e, j});
  }
  return items;
}

}  // namespace

const uint8_t* WeightOperand::expert_rows(int64_t expert, int64_t* ld, const int32_t** row_sums) const {
  if (packed) {
    const PackedView view = packed_expert(*tensor, expert);
    *ld = view.ld;
    *row_sums = view.row_sums;
    return view.values;
  }
  *ld = is_four_bit(dtype) ? cols / 2 : cols;
  *row_sums = nullptr;
  return static_cast<const uint8_t*>(tensor->const_data_ptr()) + expert * rows * row_bytes();
}

int64_t WeightOperand::row_bytes() const {
  return is_four_bit(dtype) ? cols / 2 : cols * static_cast<int64_t>(c10::elementSize(dtype));
}

at::Tensor run_fused_experts(const KernelSet& kernels, PackArch arch, const FusedExpertsArgs& args) {
  const MoeProblem p =
      check_fused_experts_args(args, arch, kernels.reads_tiles());
  at::Tensor out = args.inplace ? args.hidden_states : at::empty_like(args.hidden_states);
  if (p.tokens == 0) return out;

  PhaseRanges phases;
  phases.begin("moe_xarch::route");
  const Routing routing = route(p);
  for (int64_t e = 0; e < p.experts; ++e) {  // packed headers: of the experts this call reads
    if (routing.expert_begin[e] == routing.expert_begin[e + 1]) continue;
    if (p.w1.packed) check_packed_expert(*p.w1.tensor, "w1", e);
    if (p.w2.packed) check_packed_expert(*p.w2.tensor, "w2", e);
  }
  const int64_t slots = routing.slots();
  const int64_t M = p.tokens, K = p.hidden, N = p.inter;

  // Phase 1: gather. Each token is converted (int8: quantized) once, then
  // copied to each of its slots.
  phases.begin("moe_xarch::gather");
  Activations tokens(kernels, p.compute, M, K, "hidden_states in the GEMMs' input type ([M, K])");
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(K);
    for (int64_t m = begin; m < end; ++m) {
      load_row_f32(args.hidden_states, m, row.data());
      tokens.store_row(m, row.data(), K);
    }
  });
  Activations x(kernels, p.compute, slots, K,
                "the routed copy of hidden_states (a row of K per routed slot: up to M x topk rows)");
  at::parallel_for(0, slots, 16, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) x.copy_row(s, tokens, routing.token[s]);
  });

  // Phase 2: W1, bias, activation; the items shared among threads (work_sharing.h).
  phases.begin("moe_xarch::w1_activation");
  Activations inter(kernels, p.compute, slots, N,
                    "the intermediate (a row of N, from w1, per routed slot: up to M x topk rows)");
  std::unique_ptr<float[], AlignedFree> inter_f32;  // INT8 re-quantizes whole rows after the blocks are done
  if (p.compute == ComputeType::kInt8) {
    inter_f32 = aligned_buffer<float>(slots, inter.ld, "the fp32 intermediate (a row of N per routed slot)");
  }
  const ExpertGemm gemm1(kernels, p, p.w1, p.compute);
  const auto items1 = work_items(routing, p.experts, N, kInterBlock);
  const auto thread_scratch1 = [&] { return gemm1.scratch(); };
  for_each_shared_item(static_cast<int64_t>(items1.size()), thread_scratch1, [&](int64_t item, Scratch& scratch) {
    const auto [e, j0] = items1[item];
    const int64_t j1 = std::min(N, j0 + kInterBlock);
    const bool halves = p.activation == Activation::kSiluAndMul;  // else gate and up interleave
    const int64_t rows = routing.expert_begin[e + 1] - routing.expert_begin[e];
    const WeightTile gate = halves ? gemm1.tile(e, j0, j1, rows, x.ld, scratch, 0)
                                   : gemm1.tile(e, 2 * j0, 2 * j1, rows, x.ld, scratch, 0);
    const WeightTile up = halves ? gemm1.tile(e, N + j0, N + j1, rows, x.ld, scratch, kInterBlock) : gate;
    for (int64_t s0 = routing.expert_begin[e]; s0 < routing.expert_begin[e + 1]; s0 += kTokenChunk) {
      const int64_t m = std::min(kTokenChunk, routing.expert_begin[e + 1] - s0);
      gemm1.run(x, s0, m, gate, scratch.out0.get());
      if (halves) gemm1.run(x, s0, m, up, scratch.out1.get());
      activate_block(kernels, p, e, j0, j1, m, scratch, inter, s0, inter_f32.get());
    }
  });
  if (p.compute == ComputeType::kInt8) {
    at::parallel_for(0, slots, 16, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) inter.store_row(s, inter_f32.get() + s * inter.ld, N);
    });
  } else {
    // Zero the padding past N so padded W2 operands can run over inter.ld.
    at::parallel_for(0, slots, 64, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        if (p.compute == ComputeType::kBF16) {
          std::fill(inter.bf16.get() + s * inter.ld + N, inter.bf16.get() + (s + 1) * inter.ld, uint16_t{0});
        } else {
          std::fill(inter.f32.get() + s * inter.ld + N, inter.f32.get() + (s + 1) * inter.ld, 0.f);
        }
      }
    });
  }

  // Phase 3: W2, bias and routing weight, summed into each token's fp32 row.
  // A thread takes one run of blocks of K for every expert: threads never
  // write the same values, and each block adds its experts in one fixed order,
  // whatever the threads. Experts outside, blocks inside: a thread's rows of
  // an expert's W2 stream as one run, and its intermediate rows stay in cache
  // across them. The run is not shared (work_sharing.h): splitting it in two
  // measured no faster at M = 1 and 2% slower at M = 16.
  phases.begin("moe_xarch::w2_combine");
  auto acc = aligned_buffer<float>(M, K, "the fp32 output accumulator ([M, K] of hidden_states)");
  const ExpertGemm gemm2(kernels, p, p.w2, p.compute);
  const std::array<float, kHiddenBlock> no_bias{};  // stands in for a missing bias
  at::parallel_for(0, ceil_div(K, kHiddenBlock), 1, [&](int64_t begin, int64_t end) {
    Scratch scratch = gemm2.scratch();
    const int64_t first = begin * kHiddenBlock, last = std::min(K, end * kHiddenBlock);
    for (int64_t m = 0; m < M; ++m) std::fill(acc.get() + m * K + first, acc.get() + m * K + last, 0.f);
    for (int64_t e = 0; e < p.experts; ++e) {
      const int64_t rows = routing.expert_begin[e + 1] - routing.expert_begin[e];
      if (rows == 0) continue;
      for (int64_t block = begin; block < end; ++block) {
        const int64_t k0 = block * kHiddenBlock, k1 = std::min(K, k0 + kHiddenBlock), width = k1 - k0;
        const float* bias = p.w2.bias ? p.w2.bias + e * K + k0 : no_bias.data();
        const WeightTile w = gemm2.tile(e, k0, k1, rows, inter.ld, scratch, 0);
        for (int64_t s0 = routing.expert_begin[e]; s0 < routing.expert_begin[e + 1]; s0 += kTokenChunk) {
          const int64_t m = std::min(kTokenChunk, routing.expert_begin[e + 1] - s0);
          float* c = scratch.out0.get();
          gemm2.run(inter, s0, m, w, c);
          for (int64_t i = 0; i < m; ++i) {
            kernels.add_weighted(width, routing.weight[s0 + i], c + i * width, bias,
                                 acc.get() + routing.token[s0 + i] * K + k0);
          }
        }
      }
    }
  });

  // Phase 4: cast each token's row once.
  phases.begin("moe_xarch::cast_output");
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float* row = acc.get() + m * K;
      switch (out.scalar_type()) {
        case at::kFloat: std::copy(row, row + K, out.data_ptr<float>() + m * K); break;
        case at::kBFloat16: {
          auto* dst = out.data_ptr<c10::BFloat16>() + m * K;
          for (int64_t k = 0; k < K; ++k) dst[k] = c10::BFloat16(row[k]);
          break;
        }
        default: {
          auto* dst = out.data_ptr<c10::Half>() + m * K;
          for (int64_t k = 0; k < K; ++k) dst[k] = c10::Half(row[k]);
          break;
        }
      }
    }
  });
  return out;
}

}  // namespace moe_xarch
