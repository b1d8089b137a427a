// Host launchers of the fused forward and the vocabulary table. Every device runs the portable path
// (portable_correct.cuh) for now; sm_90a (wgmma/TMA) and sm_100a (UMMA/TMA) mainloops for the stage-1
// and stage-2 tiles are the next step of issue 3 and will be picked here from the compute capability.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cand_table.cuh"
#include "check.cuh"
#include "dcoco/api.h"
#include "portable_correct.cuh"

namespace dcoco::cuda {

std::pair<int64_t, int64_t> workspace_sizes(const CorrectParams& p) {
  const Plan l = plan_of(p);
  return {l.floats, l.ints};
}

void correct(const CorrectParams& p) {
  if (p.R == 0) return;
  if (!p.workspace || !p.counters) throw std::invalid_argument("dcoco.correct: CUDA workspace missing");
  const Plan l = plan_of(p);
  const int64_t ctas = l.stage1 + l.stage2 + l.stage3;
  if (ctas > 0x7fffffff) throw std::invalid_argument("hidden: batch too large for one CUDA launch");
  correct_kernel<<<unsigned(ctas), kThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(p);
  check(cudaGetLastError(), "dcoco.correct: CUDA launch failed");
}

void cand_table(const CandTableParams& p) {
  if (p.V == 0) return;
  const size_t smem = size_t(kThreads / 32) * p.r * sizeof(float);
  if (smem > 48 * 1024) throw std::invalid_argument("cand_proj: width r too large for the CUDA table kernel");
  const auto blocks = unsigned((p.V + kThreads / 32 - 1) / (kThreads / 32));
  cand_table_kernel<<<blocks, kThreads, smem, static_cast<cudaStream_t>(p.stream)>>>(p);
  check(cudaGetLastError(), "dcoco.cand_table: CUDA launch failed");
}

}  // namespace dcoco::cuda
