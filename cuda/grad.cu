// Host launcher of the CUDA backward (score_grad.cuh): its kernels in stream order, no host sync.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "check.cuh"
#include "dcoco/api.h"
#include "score_grad.cuh"

namespace dcoco::cuda {

int64_t grad_workspace_size(const GradParams<float>& p) { return grad_plan_of(p).floats; }

namespace {

template <int W>
void weight_grad(const GradParams<float>& p, const GradPlan& plan, cudaStream_t st) {
  const Split& s = plan.wg[W];
  DCOCO_LAUNCH(weight_gemm_kernel<W>, unsigned(s.mt * s.nt * s.splits), kThreads, kGemmSmem, st)(p, plan);
  DCOCO_LAUNCH(weight_reduce_kernel<W>, unsigned(cdiv(s.N * s.Kd, kThreads)), kThreads, 0, st)(p, plan);
}

template <int X>
void column_sum(const GradParams<float>& p, const GradPlan& plan, cudaStream_t st) {
  const ColSum& c = plan.cs[X];
  DCOCO_LAUNCH(column_sum_kernel<X>, unsigned(c.cb * c.chunks), kThreads, kThreads * sizeof(float), st)(p, plan);
  DCOCO_LAUNCH(column_reduce_kernel<X>, unsigned(cdiv(c.cols, kThreads)), kThreads, 0, st)(p, plan);
}

// Every weight GEMM, then every column sum, in enum order.
template <int... W, int... X>
void weight_sums(const GradParams<float>& p, const GradPlan& plan, cudaStream_t st, std::integer_sequence<int, W...>,
                 std::integer_sequence<int, X...>) {
  (weight_grad<W>(p, plan, st), ...);
  (column_sum<X>(p, plan, st), ...);
}

}  // namespace

void score_grad(const GradParams<float>& p) {
  if (!p.grad || !p.workspace || !p.d_hidden || !p.d_logits)
    throw std::invalid_argument("dcoco.score_grad: CUDA workspace or outputs missing");
  const GradPlan plan = grad_plan_of(p);
  if (plan.Tn == 0) return;
  const auto st = static_cast<cudaStream_t>(p.stream);
  const int64_t r = p.r, H = p.H, d = p.d;
  if (plan.trans_smem > 48 * 1024) {  // large K: the transition kernel's accumulators need the opt-in carve-out
    int dev = 0, optin = 0;
    check(cudaGetDevice(&dev), "dcoco.score_grad: device query");
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "dcoco.score_grad: device query");
    const void* kernel = reinterpret_cast<const void*>(transition_kernel);
    cudaFuncAttributes a{};
    check(cudaFuncGetAttributes(&a, kernel), "dcoco.score_grad: kernel attributes");
    if (plan.trans_smem > optin - int64_t(a.sharedSizeBytes))
      throw std::invalid_argument("dcoco.score_grad: K too large for the CUDA backward's shared memory");
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(plan.trans_smem)),
          "dcoco.score_grad: " + std::to_string(plan.trans_smem) + " bytes of shared memory not available");
  }
  const unsigned rows_s = unsigned(cdiv(plan.S, kThreads)), rows_c = unsigned(cdiv(plan.C, kThreads));
  // forward
  DCOCO_LAUNCH(slot_proj_kernel, output_tiles(plan.S, 3 * r), kThreads, kGemmSmem, st)(p, plan);
  DCOCO_LAUNCH(cand_proj_kernel, output_tiles(plan.C, r), kThreads, kGemmSmem, st)(p, plan);
  DCOCO_LAUNCH(ln_inputs_kernel, unsigned(cdiv(plan.S + plan.C, kThreads)), kThreads, 0, st)(p, plan);
  DCOCO_LAUNCH(fuse_kernel, output_tiles(plan.C, r), kThreads, kGemmSmem, st)(p, plan);
  DCOCO_LAUNCH(ln_fuse_kernel, rows_c, kThreads, 0, st)(p, plan);
  DCOCO_LAUNCH(pred_succ_kernel, output_tiles(plan.C, 2 * H), kThreads, kGemmSmem, st)(p, plan);
  DCOCO_LAUNCH(pair_kernel, output_tiles(plan.Tn, H), kThreads, kGemmSmem, st)(p, plan);
  // the grid
  DCOCO_LAUNCH(transition_kernel, unsigned(plan.Tn), kThreads, size_t(plan.trans_smem), st)(p, plan);
  // backward
  DCOCO_LAUNCH(dz_kernel, output_tiles(plan.C, r), kThreads, kGemmSmem, st)(p, plan);
  DCOCO_LAUNCH(ln_z_grad_kernel, rows_c, kThreads, 0, st)(p, plan);
  DCOCO_LAUNCH(db_kernel, output_tiles(plan.C, r), kThreads, kGemmSmem, st)(p, plan);
  DCOCO_LAUNCH(ln_b_grad_kernel, unsigned(cdiv(plan.C + plan.S * r, kThreads)), kThreads, 0, st)(p, plan);
  DCOCO_LAUNCH(dg_kernel, output_tiles(plan.S, r), kThreads, kGemmSmem, st)(p, plan);
  DCOCO_LAUNCH(ds_kernel, output_tiles(plan.Tn, r), kThreads, kGemmSmem, st)(p, plan);
  DCOCO_LAUNCH(ln_g_grad_kernel, rows_s, kThreads, 0, st)(p, plan);
  DCOCO_LAUNCH(d_hidden_kernel, output_tiles(plan.S, d), kThreads, kGemmSmem, st)(p, plan);
  // weights
  weight_sums(p, plan, st, std::make_integer_sequence<int, kWeightGemms>{}, std::make_integer_sequence<int, kColumnSums>{});
  check(cudaGetLastError(), "dcoco.score_grad: CUDA launch failed");
}

}  // namespace dcoco::cuda
