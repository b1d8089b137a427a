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
void weight_grad(const GradParams<float>& p, const GradPlan& l, cudaStream_t st) {
  const Split& s = l.wg[W];
  DCOCO_LAUNCH(weight_gemm_kernel<W>, unsigned(s.mt * s.nt * s.splits), kThreads, kGemmSmem, st)(p, l);
  DCOCO_LAUNCH(weight_reduce_kernel<W>, unsigned(cdiv(s.N * s.Kd, kThreads)), kThreads, 0, st)(p, l);
}

template <int X>
void column_sum(const GradParams<float>& p, const GradPlan& l, cudaStream_t st) {
  const ColSum& c = l.cs[X];
  DCOCO_LAUNCH(column_sum_kernel<X>, unsigned(c.cb * c.chunks), kThreads, kThreads * sizeof(float), st)(p, l);
  DCOCO_LAUNCH(column_reduce_kernel<X>, unsigned(cdiv(c.cols, kThreads)), kThreads, 0, st)(p, l);
}

// Every weight GEMM, then every column sum, in enum order.
template <int... W, int... X>
void weight_sums(const GradParams<float>& p, const GradPlan& l, cudaStream_t st, std::integer_sequence<int, W...>,
                 std::integer_sequence<int, X...>) {
  (weight_grad<W>(p, l, st), ...);
  (column_sum<X>(p, l, st), ...);
}

}  // namespace

void score_grad(const GradParams<float>& p) {
  if (!p.grad || !p.workspace || !p.d_hidden || !p.d_logits)
    throw std::invalid_argument("dcoco.score_grad: CUDA workspace or outputs missing");
  const GradPlan l = grad_plan_of(p);
  if (l.Tn == 0) return;
  const auto st = static_cast<cudaStream_t>(p.stream);
  const int64_t r = p.r, H = p.H, d = p.d;
  if (l.trans_smem > 48 * 1024) {  // large K: the transition kernel's accumulators need the opt-in carve-out
    int dev = 0, optin = 0;
    check(cudaGetDevice(&dev), "dcoco.score_grad: device query");
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "dcoco.score_grad: device query");
    const void* kernel = reinterpret_cast<const void*>(transition_kernel);
    cudaFuncAttributes a{};
    check(cudaFuncGetAttributes(&a, kernel), "dcoco.score_grad: kernel attributes");
    if (l.trans_smem > optin - int64_t(a.sharedSizeBytes))
      throw std::invalid_argument("dcoco.score_grad: K too large for the CUDA backward's shared memory");
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.trans_smem)),
          "dcoco.score_grad: " + std::to_string(l.trans_smem) + " bytes of shared memory not available");
  }
  const unsigned rows_s = unsigned(cdiv(l.S, kThreads)), rows_c = unsigned(cdiv(l.C, kThreads));
  // forward
  DCOCO_LAUNCH(slot_proj_kernel, output_tiles(l.S, 3 * r), kThreads, kGemmSmem, st)(p, l);
  DCOCO_LAUNCH(cand_proj_kernel, output_tiles(l.C, r), kThreads, kGemmSmem, st)(p, l);
  DCOCO_LAUNCH(ln_inputs_kernel, unsigned(cdiv(l.S + l.C, kThreads)), kThreads, 0, st)(p, l);
  DCOCO_LAUNCH(fuse_kernel, output_tiles(l.C, r), kThreads, kGemmSmem, st)(p, l);
  DCOCO_LAUNCH(ln_fuse_kernel, rows_c, kThreads, 0, st)(p, l);
  DCOCO_LAUNCH(pred_succ_kernel, output_tiles(l.C, 2 * H), kThreads, kGemmSmem, st)(p, l);
  DCOCO_LAUNCH(pair_kernel, output_tiles(l.Tn, H), kThreads, kGemmSmem, st)(p, l);
  // the grid
  DCOCO_LAUNCH(transition_kernel, unsigned(l.Tn), kThreads, size_t(l.trans_smem), st)(p, l);
  // backward
  DCOCO_LAUNCH(dz_kernel, output_tiles(l.C, r), kThreads, kGemmSmem, st)(p, l);
  DCOCO_LAUNCH(ln_z_grad_kernel, rows_c, kThreads, 0, st)(p, l);
  DCOCO_LAUNCH(db_kernel, output_tiles(l.C, r), kThreads, kGemmSmem, st)(p, l);
  DCOCO_LAUNCH(ln_b_grad_kernel, unsigned(cdiv(l.C + l.S * r, kThreads)), kThreads, 0, st)(p, l);
  DCOCO_LAUNCH(dg_kernel, output_tiles(l.S, r), kThreads, kGemmSmem, st)(p, l);
  DCOCO_LAUNCH(ds_kernel, output_tiles(l.Tn, r), kThreads, kGemmSmem, st)(p, l);
  DCOCO_LAUNCH(ln_g_grad_kernel, rows_s, kThreads, 0, st)(p, l);
  DCOCO_LAUNCH(d_hidden_kernel, output_tiles(l.S, d), kThreads, kGemmSmem, st)(p, l);
  // weights
  weight_sums(p, l, st, std::make_integer_sequence<int, kWeightGemms>{}, std::make_integer_sequence<int, kColumnSums>{});
  check(cudaGetLastError(), "dcoco.score_grad: CUDA launch failed");
}

}  // namespace dcoco::cuda
