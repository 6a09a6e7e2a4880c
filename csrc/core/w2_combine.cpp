
#include <algorithm>
#include <array>

#include "core/checked.h"
#include "core/expert_gemm.h"
#include "core/phases.h"
#include "core/stable_torch.h"
#include "core/work_sharing.h"

namespace moe_xarch {

W2Combine::W2Combine(const KernelSet& kernels, const MoeProblem& p, const Routing& routing, const Activations& inter)
    : kernels_(kernels),
      p_(p),
      routing_(routing),
      inter_(inter),
      acc_(aligned_buffer<float>(p.tokens, p.hidden, "the fp32 output accumulator ([M, K] of hidden_states)")),
      gemm_(kernels, p, p.w2),
      width_(item_width(kHiddenBlock, [&](int64_t w) { return ceil_div(p.hidden, w); })),
      blocks_(ceil_div(p.hidden, width_)) {}

// A thread takes one run of blocks of K for every expert: threads never
// write the same values, and each block adds its experts in one fixed order,
// whatever the threads and the blocks' width (no atomics). Experts outside,
// blocks inside: a thread's rows of an expert's W2 stream as one run, and
// its intermediate rows stay in cache across them (blocks shared item by
// item, experts inside, measured 4-10% slower in prefill at 1 and 2 threads).
void W2Combine::run(int64_t begin, int64_t end, Scratch& scratch, const ExpertCountdown& countdown) {
  if (begin >= end) return;  // more threads than blocks: no expert to wait for
  const int64_t M = p_.tokens, K = p_.hidden;
  const std::array<float, kHiddenBlock> no_bias{};
  float* acc = acc_.get();
  const int64_t first = begin * width_, last = std::min(K, end * width_);
  for (int64_t m = 0; m < M; ++m) std::fill(acc + m * K + first, acc + m * K + last, 0.f);
  for (int64_t e = 0; e < p_.experts; ++e) {
    const int64_t rows = routing_.rows(e);
    if (rows == 0) continue;
    if (!countdown.wait(e)) return;
    for (int64_t block = begin; block < end; ++block) {
      const int64_t k0 = block * width_, k1 = std::min(K, k0 + width_), cols = k1 - k0;
      const float* bias = p_.w2.bias ? p_.w2.bias + e * K + k0 : no_bias.data();
      const WeightTile w = gemm_.tile(e, k0, k1, rows, inter_.ld, scratch, 0);
      for (int64_t s0 = routing_.expert_begin[e]; s0 < routing_.expert_begin[e + 1]; s0 += kTokenChunk) {
        const int64_t m = std::min(kTokenChunk, routing_.expert_begin[e + 1] - s0);
        float* c = scratch.out0.get();
        gemm_.run(inter_, s0, m, w, c);
        for (int64_t i = 0; i < m; ++i) {
          kernels_.add_weighted(cols, routing_.weight[s0 + i], c + i * cols, bias,
                                acc + routing_.token[s0 + i] * K + k0);
        }
      }
    }
  }
}

}  // namespace moe_xarch
