// The vocabulary table on the GPU (prepare_inference): T[v] = W_fuse[:, :r] LN(W_cand E[v]).
#pragma once
#include "plan.cuh"  // kThreads, wdot

namespace dcoco::cuda {


// The vocabulary table: T[v] = W_fuse[:, :r] LN(W_cand E[v]), one warp per vocabulary row; dynamic shared
// memory holds each warp's (r) row LN(W_cand E[v]).
__global__ void __launch_bounds__(kThreads) cand_table_kernel(CandTableParams p) {
  DCOCO_DYNAMIC_SMEM(smem);
  float* const rows = reinterpret_cast<float*>(smem);
  const int64_t v = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (v >= p.V) return;
  float* b = rows + (threadIdx.x / 32) * p.r;
  for (int64_t o = 0; o < p.r; ++o) {
    const float x = warp_dot(p.embed, p.embed_dtype, v * p.d, p.cand_proj + o * p.d, p.d);
    if (threadIdx.x % 32 == 0) b[o] = x;
  }
  __syncwarp();
  if (threadIdx.x % 32 == 0) layer_norm(b, int(p.r), nullptr, nullptr);
  __syncwarp();
  for (int64_t o = threadIdx.x % 32; o < p.r; o += 32) p.table[v * p.r + o] = wdot(p.fuse_proj + o * 2 * p.r, b, p.r);
}

}  // namespace dcoco::cuda
