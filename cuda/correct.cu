// Host launchers of the fused forward and the vocabulary table. Every device runs the portable path
// (portable_correct.cuh) for now; the sm_90a (wgmma/TMA) and sm_100a (UMMA/TMA) mainloops for phase 1
// are the next step of issue 3 and will be picked here from the device's compute capability.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "dcoco/api.h"
#include "cand_table.cuh"
#include "portable_correct.cuh"

namespace dcoco::cuda {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

int64_t workspace_floats(const CorrectParams& p) { return p.R * slab_floats(p); }

void correct(const CorrectParams& p) {
  if (p.R == 0) return;
  if (p.R > 65535) throw std::invalid_argument("hidden: at most 65535 requests per CUDA launch, got R=" + std::to_string(p.R));
  if (!p.workspace || !p.counters) throw std::invalid_argument("dcoco.correct: CUDA workspace missing");
  correct_kernel<<<dim3(kGroups, unsigned(p.R)), kThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(p);
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
