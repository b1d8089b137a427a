// dcoco.select on the GPU: one thread per request walks its (B-1,K,K) grid with the shared rules.
// Grids are tiny (B K^2 floats), so the launch is latency-bound; no host sync, current stream.
#include <cuda_runtime.h>

#include "check.cuh"
#include "dcoco/api.h"
#include "select.h"

namespace dcoco::cuda {
namespace {

__global__ void select_kernel(SelectParams p) {
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q < p.R) select_one(p, q);
}

}  // namespace

void select(const SelectParams& p) {
  if (p.R == 0) return;
  constexpr int kThreads = 128;
  const auto blocks = unsigned((p.R + kThreads - 1) / kThreads);
  DCOCO_LAUNCH(select_kernel, blocks, kThreads, 0, static_cast<cudaStream_t>(p.stream))(p);
  check(cudaGetLastError(), "dcoco.select: CUDA launch failed");
}

}  // namespace dcoco::cuda
