// The architecture-neutral fused MoE driver (see the spec for the math).
//
// Phases, each parallel over independent work items:
//   0. route: a counting sort of the (token, slot) pairs by expert;
//   1. gather each routed token row into the GEMM's input type (bf16, fp32, or
//      int8 quantized per token), rows padded with zeros to kPackAlign;
//   2. per (expert, block of N): h = x @ W1^T + b1, activation -> intermediate;
//      (INT8: the intermediate is re-quantized per row);
//   3. per (expert, block of K): y = a @ W2^T + b2, times the routing weight,
//      into a [M * topk, K] fp32 buffer: no atomics, deterministic order;
//   4. per token: sum its slots in fp32, cast once into the output.
#include "core/fused_experts.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace moe_kernels {
namespace {

constexpr int64_t kTokenChunk = 128;  // rows of a per GEMM call: bounds the fp32 tile buffers
constexpr int64_t kInterBlock = 32;   // activation columns per phase-2 work item
constexpr int64_t kHiddenBlock = 64;  // output columns per phase-3 work item

// Adding and taking away 1.5 * 2^23 rounds a float of magnitude below 2^22 to
// an integer, half to even as nearbyint does, in plain arithmetic the compiler
// vectorizes (nearbyint is a library call without SSE4.1).
constexpr float kRoundToInteger = 12582912.f;

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
std::unique_ptr<T[], AlignedFree> aligned_buffer(int64_t count) {
  const size_t bytes = round_up(std::max<int64_t>(count, 1) * sizeof(T), kPackAlign);
  return std::unique_ptr<T[], AlignedFree>(static_cast<T*>(std::aligned_alloc(kPackAlign, bytes)));
}

uint16_t to_bf16_bits(float value) { return c10::BFloat16(value).x; }

void quantize_row_int8(const float* x, int64_t n, int8_t* q, float* scale) {
  // The largest |x| as the bits of a non-negative float, which order as
  // integers do: an integer max, which the compiler vectorizes (a float max
  // it may not, for NaN's sake; NaNs are skipped here as std::max skips them).
  int32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    bits &= 0x7fffffff;
    amax_bits = std::max(amax_bits, bits <= 0x7f800000 ? bits : 0);
  }
  float amax;
  std::memcpy(&amax, &amax_bits, sizeof(amax));
  const float s = std::max(amax, 1e-10f) / 127.f;
  // x / s lies in [-127, 127].
  for (int64_t i = 0; i < n; ++i) {
    const float rounded = (x[i] / s + kRoundToInteger) - kRoundToInteger;
    q[i] = static_cast<int8_t>(std::min(std::max(rounded, -127.f), 127.f));
  }
  *scale = s;
}

// The routed (token, slot) pairs sorted by expert, stable in token order.
struct Routing {
  std::vector<int64_t> expert_begin;  // E + 1 offsets into the sorted slots
  std::vector<int64_t> token;         // token row of each sorted slot
  std::vector<int64_t> flat;          // m * topk + t of each sorted slot
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
  r.flat.resize(slots);
  r.weight.resize(slots);
  std::vector<int64_t> next(r.expert_begin.begin(), r.expert_begin.end() - 1);
  for (int64_t i = 0; i < pairs; ++i) {
    if (ids[i] < 0) continue;
    const int64_t s = next[ids[i]]++;
    r.token[s] = i / p.topk;
    r.flat[s] = i;
    r.weight[s] = weights[i];
  }
  return r;
}

// A GEMM's left operand: `rows` rows of `ld` values in the compute type, zero
// padded past the logical width; per-row scales for int8.
struct Activations {
  int64_t ld = 0;
  std::unique_ptr<uint16_t[], AlignedFree> bf16;
  std::unique_ptr<float[], AlignedFree> f32;
  std::unique_ptr<int8_t[], AlignedFree> s8;
  std::unique_ptr<float[], AlignedFree> scale;

  Activations(ComputeType compute, int64_t rows, int64_t width) : ld(round_up(width, kPackAlign)) {
    switch (compute) {
      case ComputeType::kBF16: bf16 = aligned_buffer<uint16_t>(rows * ld); break;
      case ComputeType::kF32: f32 = aligned_buffer<float>(rows * ld); break;
      case ComputeType::kInt8:
        s8 = aligned_buffer<int8_t>(rows * ld);
        scale = aligned_buffer<float>(rows);
        break;
    }
  }

  // Stores one fp32 row (width values) at `row`, converting and padding.
  void store_row(ComputeType compute, int64_t row, const float* values, int64_t width) {
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
        quantize_row_int8(values, width, dst, scale.get() + row);
        std::fill(dst + width, dst + ld, int8_t{0});
        break;
      }
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

// One thread's scratch for a work item: widened weight tiles and the fp32
// GEMM output tiles.
struct Scratch {
  std::unique_ptr<float[], AlignedFree> weights_f32;
  std::unique_ptr<uint16_t[], AlignedFree> weights_bf16;
  std::unique_ptr<float[], AlignedFree> out0, out1;
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
  bool tiles = false;          // bf16 or int8 values in the tile layout
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
    if (w_.dtype == at::kFloat8_e4m3fn && compute_ == ComputeType::kBF16 && kernels_.gemm_bf16_fp8 &&
        m <= kernels_.gemm_bf16_fp8_rows) {
      // The logical width: block scales end there, padding or not.
      t.k = w_.cols;
      t.fp8 = true;
      t.fp8_scales = {w_.block_scale + expert * w_.scale_rows * w_.scale_cols, w_.scale_cols, r0, p_.block_n,
                      p_.block_k};
    } else if (dequantizes()) {
      if (compute_ == ComputeType::kBF16) {
        uint16_t* out = scratch.weights_bf16.get() + slot * a_ld;
        widen_rows(base, ld, expert, r0, r1, a_ld, out, kernels_.fp8_to_bf16, to_bf16_bits);
        t.values = reinterpret_cast<const uint8_t*>(out);
      } else {
        float* out = scratch.weights_f32.get() + slot * a_ld;
        widen_rows(base, ld, expert, r0, r1, a_ld, out, kernels_.fp8_to_f32, [](float v) { return v; });
        t.values = reinterpret_cast<const uint8_t*>(out);
      }
      t.ld = t.k = a_ld;
    }
    return t;
  }

  // The `m` activation rows starting at `row` times the tile.
  void run(const Activations& a, int64_t row, int64_t m, const WeightTile& w, float* c) const {
    switch (compute_) {
      case ComputeType::kInt8:
        (w.tiles ? kernels_.gemm_s8_tiles : kernels_.gemm_s8)(
            m, w.rows, w.k, a.s8.get() + row * a.ld, a.ld, a.scale.get() + row,
            reinterpret_cast<const int8_t*>(w.values), w.ld, w.channel_scale, w.row_sums, c, w.rows);
        break;
      case ComputeType::kBF16:
        if (w.fp8) {
          kernels_.gemm_bf16_fp8(m, w.rows, w.k, a.bf16.get() + row * a.ld, a.ld, w.values, w.ld, w.fp8_scales, c,
                                 w.rows);
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

  // fp16 and fp8 weights are widened tile by tile into scratch before the GEMM.
  bool dequantizes() const { return w_.dtype == at::kHalf || w_.dtype == at::kFloat8_e4m3fn; }

  // One thread's scratch: output tiles, and weight tiles only where this operand needs them.
  Scratch scratch(int64_t ld) const {
    Scratch s;
    if (dequantizes() && compute_ == ComputeType::kBF16) s.weights_bf16 = aligned_buffer<uint16_t>(kMaxTileRows * ld);
    if (dequantizes() && compute_ == ComputeType::kF32) s.weights_f32 = aligned_buffer<float>(kMaxTileRows * ld);
    s.out0 = aligned_buffer<float>(kTokenChunk * kMaxTileRows);
    s.out1 = aligned_buffer<float>(kTokenChunk * kMaxTileRows);
    return s;
  }

 private:
  // fp16 rows (converted here) or fp8 rows (times their block scales, by the
  // kernel set) into a zero-padded tile.
  template <typename T, typename Fp8Row, typename Convert>
  void widen_rows(const uint8_t* base, int64_t ld, int64_t expert, int64_t r0, int64_t r1, int64_t ld_out,
                  T* out, Fp8Row fp8_row, Convert convert) const {
    const int64_t cols = w_.cols;
    for (int64_t r = r0; r < r1; ++r) {
      T* dst = out + (r - r0) * ld_out;
      if (w_.dtype == at::kHalf) {
        const auto* src = reinterpret_cast<const c10::Half*>(base) + r * ld;
        for (int64_t c = 0; c < cols; ++c) dst[c] = convert(static_cast<float>(src[c]));
      } else {
        const float* scales = w_.block_scale + (expert * w_.scale_rows + r / p_.block_n) * w_.scale_cols;
        fp8_row(cols, base + r * ld, scales, p_.block_k, dst);
      }
      std::fill(dst + cols, dst + ld_out, T{0});
    }
  }

  const KernelSet& kernels_;
  const MoeProblem& p_;
  const WeightOperand& w_;
  ComputeType compute_;
};

// e^x to within 2 ulp (Cephes' expf: x = n ln 2 + r, a degree-6 polynomial
// in r, 2^n put into the exponent), inline: std::exp is a library call per
// value, a tenth of an int8 prefill.
inline __attribute__((always_inline)) float exp_approx(float x) {
  x = std::max(x, -87.f);
  x = std::min(x, 88.f);
  const float n = (x * 1.44269504f + kRoundToInteger) - kRoundToInteger;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float e_r = poly * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return e_r * two_n;
}

inline __attribute__((always_inline)) float silu(float g) { return g / (1.f + exp_approx(-g)); }

// Phase 2 epilogue: bias, activation, store of `m` rows of one column block,
// one branch-free loop per activation.
void activate_block(const MoeProblem& p, int64_t expert, int64_t j0, int64_t j1, int64_t m,
                    float* out0, float* out1, std::vector<float>& row, Activations& inter,
                    int64_t first_row, std::vector<float>* inter_f32) {
  const int64_t width = j1 - j0;
  // Without a bias, a block of zeros stands in for it.
  std::array<float, 2 * kInterBlock> no_bias{};
  const float* bias = p.w1.bias ? p.w1.bias + expert * 2 * p.inter : nullptr;
  const bool halves = p.activation == Activation::kSiluAndMul;
  const float* bias0 = bias ? bias + (halves ? j0 : 2 * j0) : no_bias.data();
  const float* bias1 = bias ? bias + p.inter + j0 : no_bias.data();
  const float limit = p.limit.value_or(std::numeric_limits<float>::infinity());
  float* out = row.data();
  for (int64_t i = 0; i < m; ++i) {
    if (halves) {
      const float* gate = out0 + i * width;
      const float* up = out1 + i * width;
      for (int64_t j = 0; j < width; ++j) out[j] = silu(gate[j] + bias0[j]) * (up[j] + bias1[j]);
    } else {
      const float* h = out0 + i * 2 * width;
      for (int64_t j = 0; j < width; ++j) {
        const float gate = std::min(h[2 * j] + bias0[2 * j], limit);
        const float up = std::min(std::max(h[2 * j + 1] + bias0[2 * j + 1], -limit), limit);
        out[j] = gate / (1.f + exp_approx(-p.alpha * gate)) * (up + 1.f);
      }
    }
    const int64_t s = first_row + i;
    if (inter_f32) {
      std::copy(row.begin(), row.begin() + width, inter_f32->data() + s * inter.ld + j0);
    } else if (p.compute == ComputeType::kBF16) {
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
  *ld = cols;
  *row_sums = nullptr;
  return static_cast<const uint8_t*>(tensor->const_data_ptr()) +
         expert * rows * cols * c10::elementSize(dtype);
}

at::Tensor run_fused_experts(const KernelSet& kernels, PackArch arch, const FusedExpertsArgs& args) {
  const MoeProblem p =
      check_fused_experts_args(args, arch, kernels.reads_tiles());
  at::Tensor out = args.inplace ? args.hidden_states : at::empty_like(args.hidden_states);
  if (p.tokens == 0) return out;

  const Routing routing = route(p);
  const int64_t slots = routing.slots();
  const int64_t M = p.tokens, K = p.hidden, N = p.inter, topk = p.topk;

  // Phase 1: gather.
  Activations x(p.compute, slots, K);
  at::parallel_for(0, slots, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(K);
    for (int64_t s = begin; s < end; ++s) {
      load_row_f32(args.hidden_states, routing.token[s], row.data());
      x.store_row(p.compute, s, row.data(), K);
    }
  });

  // Phase 2: W1, bias, activation.
  Activations inter(p.compute, slots, N);
  std::vector<float> inter_f32;  // INT8 re-quantizes whole rows after the blocks are done
  if (p.compute == ComputeType::kInt8) inter_f32.assign(slots * inter.ld, 0.f);
  const ExpertGemm gemm1(kernels, p, p.w1, p.compute);
  const auto items1 = work_items(routing, p.experts, N, kInterBlock);
  at::parallel_for(0, static_cast<int64_t>(items1.size()), 1, [&](int64_t begin, int64_t end) {
    Scratch scratch = gemm1.scratch(x.ld);
    std::vector<float> row(kInterBlock);
    for (int64_t item = begin; item < end; ++item) {
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
        activate_block(p, e, j0, j1, m, scratch.out0.get(), scratch.out1.get(), row, inter, s0,
                       inter_f32.empty() ? nullptr : &inter_f32);
      }
    }
  });
  if (p.compute == ComputeType::kInt8) {
    at::parallel_for(0, slots, 16, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) inter.store_row(p.compute, s, inter_f32.data() + s * inter.ld, N);
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

  // Phase 3: W2, bias, routing weight, into per-(token, slot) rows.
  auto y = aligned_buffer<float>(M * topk * K);
  const ExpertGemm gemm2(kernels, p, p.w2, p.compute);
  const auto items2 = work_items(routing, p.experts, K, kHiddenBlock);
  at::parallel_for(0, static_cast<int64_t>(items2.size()), 1, [&](int64_t begin, int64_t end) {
    Scratch scratch = gemm2.scratch(inter.ld);
    for (int64_t item = begin; item < end; ++item) {
      const auto [e, k0] = items2[item];
      const int64_t k1 = std::min(K, k0 + kHiddenBlock), width = k1 - k0;
      const float* bias = p.w2.bias ? p.w2.bias + e * K : nullptr;
      const WeightTile w =
          gemm2.tile(e, k0, k1, routing.expert_begin[e + 1] - routing.expert_begin[e], inter.ld, scratch, 0);
      for (int64_t s0 = routing.expert_begin[e]; s0 < routing.expert_begin[e + 1]; s0 += kTokenChunk) {
        const int64_t m = std::min(kTokenChunk, routing.expert_begin[e + 1] - s0);
        float* c = scratch.out0.get();
        gemm2.run(inter, s0, m, w, c);
        for (int64_t i = 0; i < m; ++i) {
          const float w = routing.weight[s0 + i];
          float* dst = y.get() + routing.flat[s0 + i] * K + k0;
          for (int64_t j = 0; j < width; ++j) dst[j] = w * (c[i * width + j] + (bias ? bias[k0 + j] : 0.f));
        }
      }
    }
  });

  // Phase 4: reduce the slots of each token, cast once.
  const int64_t* ids = p.topk_ids.data_ptr<int64_t>();
  at::parallel_for(0, M, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(K);
    for (int64_t m = begin; m < end; ++m) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < topk; ++t) {
        if (ids[m * topk + t] < 0) continue;
        const float* src = y.get() + (m * topk + t) * K;
        for (int64_t k = 0; k < K; ++k) acc[k] += src[k];
      }
      switch (out.scalar_type()) {
        case at::kFloat: std::copy(acc.begin(), acc.end(), out.data_ptr<float>() + m * K); break;
        case at::kBFloat16: {
          auto* dst = out.data_ptr<c10::BFloat16>() + m * K;
          for (int64_t k = 0; k < K; ++k) dst[k] = c10::BFloat16(acc[k]);
          break;
        }
        default: {
          auto* dst = out.data_ptr<c10::Half>() + m * K;
          for (int64_t k = 0; k < K; ++k) dst[k] = c10::Half(acc[k]);
          break;
        }
      }
    }
  });
  return out;
}

}  // namespace moe_kernels
