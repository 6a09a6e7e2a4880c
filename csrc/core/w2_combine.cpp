
#include <algorithm>
#include <array>

#include "core/checked.h"
#include "core/expert_gemm.h"
#include "core/phases.h"
#include "core/stable_torch.h"
#include "core/work_sharing.h"

namespace moe_xarch {

// A thread takes one run of blocks of K for every expert: threads never
// write the same values, and each block adds its experts in one fixed order,
// whatever the threads and the blocks' width (no atomics). Experts outside,
// blocks inside: a thread's rows of an expert's W2 stream as one run, and
// its intermediate rows stay in cache across them (blocks shared item by
// item, experts inside, measured 4-10% slower in prefill at 1 and 2 threads).
AlignedBuffer<float> w2_combine(const KernelSet& kernels, const MoeProblem& p, const Routing& routing,
                                const Activations& inter) {
  const int64_t M = p.tokens, K = p.hidden;
  auto acc = aligned_buffer<float>(M, K, "the fp32 output accumulator ([M, K] of hidden_states)");
  const ExpertGemm gemm2(kernels, p, p.w2);
  const std::array<float, kHiddenBlock> no_bias{};
  const int64_t width = item_width(kHiddenBlock, [&](int64_t w) { return ceil_div(K, w); });
  parallel_for(0, ceil_div(K, width), 1, [&](int64_t begin, int64_t end) {
    Scratch scratch = gemm2.scratch();
    const int64_t first = begin * width, last = std::min(K, end * width);
    for (int64_t m = 0; m < M; ++m) std::fill(acc.get() + m * K + first, acc.get() + m * K + last, 0.f);
    for (int64_t e = 0; e < p.experts; ++e) {
      const int64_t rows = routing.rows(e);
      if (rows == 0) continue;
      for (int64_t block = begin; block < end; ++block) {
        const int64_t k0 = block * width, k1 = std::min(K, k0 + width), cols = k1 - k0;
        const float* bias = p.w2.bias ? p.w2.bias + e * K + k0 : no_bias.data();
        const WeightTile w = gemm2.tile(e, k0, k1, rows, inter.ld, scratch, 0);
        for (int64_t s0 = routing.expert_begin[e]; s0 < routing.expert_begin[e + 1]; s0 += kTokenChunk) {
          const int64_t m = std::min(kTokenChunk, routing.expert_begin[e + 1] - s0);
          float* c = scratch.out0.get();
          gemm2.run(inter, s0, m, w, c);
          for (int64_t i = 0; i < m; ++i) {
            kernels.add_weighted(cols, routing.weight[s0 + i], c + i * cols, bias,
                                 acc.get() + routing.token[s0 + i] * K + k0);
          }
        }
      }
    }
  });
  gemm2.check_values();
  return acc;
}

}  // namespace moe_xarch
