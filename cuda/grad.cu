// Host launcher of the CUDA backward (score_grad.cuh): five kernels in stream order, no host sync.
#include <cuda_runtime.h>

#include <stdexcept>

#include "check.cuh"
#include "dcoco/api.h"
#include "score_grad.cuh"

namespace dcoco::cuda {

int64_t grad_workspace_size(const GradParams<float>& p) { return grad_plan_of(p).floats; }

void score_grad(const GradParams<float>& p) {
  if (!p.grad || !p.workspace || !p.d_hidden || !p.d_logits)
    throw std::invalid_argument("dcoco.score_grad: CUDA workspace or outputs missing");
  const GradPlan l = grad_plan_of(p);
  if (l.Tn == 0) return;
  const auto st = static_cast<cudaStream_t>(p.stream);
  const size_t vec = size_t(p.r) * sizeof(float);  // one (r) row of shared memory
  if (vec > 48 * 1024) throw std::invalid_argument("cand_proj: width r too large for the CUDA backward");
  DCOCO_LAUNCH(grad_forward_kernel, unsigned(l.S), kThreads, vec, st)(p);
  DCOCO_LAUNCH(grad_transition_kernel, unsigned(l.Tn), kThreads, vec, st)(p);
  DCOCO_LAUNCH(grad_slot_kernel, unsigned(l.S), kThreads, vec, st)(p);
  OuterSum sums[kOuterSums];
  outer_sums(p, sums);
  for (const OuterSum& o : sums)
    DCOCO_LAUNCH(outer_sum_kernel, unsigned(cdiv(o.N * o.Kd, kThreads)), kThreads, 0, st)(o, p);
  DCOCO_LAUNCH(column_sum_kernel, unsigned(cdiv(p.r + p.H + 1, kThreads)), kThreads, 0, st)(p);
  check(cudaGetLastError(), "dcoco.score_grad: CUDA launch failed");
}

}  // namespace dcoco::cuda
