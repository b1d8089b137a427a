// The fused forward: every stage of plan.cuh in one launch, with the MMA policy of the device's arch.
// float32 inputs always take the exact fp32 (SIMT) policy; 16-bit inputs take the arch's tensor cores.
#pragma once
#include "dcoco/dispatch.h"
#include "stage_walk.cuh"

// The tensor-core policies: compiled by nvcc, and on the CPU by tests/emulate (which emulates their instructions).
#if defined(__CUDACC__) || defined(DCOCO_EMULATE_MMA)
#define DCOCO_TENSOR_CORES 1
#include "sm80_mma.cuh"
#include "sm90_gmma.cuh"
#include "sm100_umma.cuh"
#endif


namespace dcoco::cuda {

#if defined(DCOCO_TENSOR_CORES)
template <Arch A, class Elem, int APlanes>
using TensorCoreMma =
    std::conditional_t<A == Arch::sm100, Sm100Mma<Elem, APlanes>,
                       std::conditional_t<A == Arch::sm90, Sm90Mma<Elem, APlanes>, Sm80Mma<Elem, APlanes>>>;

// Whether this compilation target can run arch A's instructions (other targets get an empty kernel).
template <Arch A>
__device__ constexpr bool compiled_for() {
#if defined(__CUDA_ARCH__)
  if constexpr (A == Arch::sm90) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    return true;
#else
    return false;
#endif
  }
  if constexpr (A == Arch::sm100) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL)
    return true;
#else
    return false;
#endif
  }
  if constexpr (A == Arch::sm80) return __CUDA_ARCH__ >= 800;
#endif
  return true;
}
#endif

template <Arch A>
__device__ void run_tile(const ForwardParams& p, const Plan& l, int64_t t, char* smem) {
  float* ws = p.workspace;
  int* counters = p.counters;
  if (t < l.project_tiles) {
    const ProjectTile x = project_tile_of(p, l, t);
    if constexpr (A != Arch::simt) {
#if defined(DCOCO_TENSOR_CORES)
      const DType xt = x.slots ? p.hidden_dtype : p.embed_dtype;
      if (xt == DType::bf16) return project<TensorCoreMma<A, cute::bfloat16_t, 1>>(p, l, x, smem, ws, counters);
      if (xt == DType::f16) return project<TensorCoreMma<A, cute::half_t, 1>>(p, l, x, smem, ws, counters);
#endif
    }
    return project<SimtMma>(p, l, x, smem, ws, counters);
  }
  t -= l.project_tiles;
  if (t < l.fuse_tiles) {
    if constexpr (A != Arch::simt) {
#if defined(DCOCO_TENSOR_CORES)
      if (p.hidden_dtype != DType::f32) return fuse<TensorCoreMma<A, cute::bfloat16_t, 2>>(p, l, t, smem, ws, counters);
#endif
    }
    return fuse<SimtMma>(p, l, t, smem, ws, counters);
  }
  t -= l.fuse_tiles;
  if (t < l.score_tiles) return score_tile(p, l, t, smem, ws, counters);
  walk_tile(p, l, t - l.score_tiles, smem, ws, counters);
}

// Grid: plan.ctas CTAs of kThreads with plan.smem bytes of dynamic shared memory; counters zeroed. sms and
// smem_cap: what the host planned with (plan_of).
template <Arch A>
__global__ void __launch_bounds__(kThreads) forward_kernel(ForwardParams p, int sms, int64_t smem_cap) {
#if defined(DCOCO_TENSOR_CORES)
  if constexpr (!compiled_for<A>()) {
    __trap();
  } else
#endif
  {
    DCOCO_DYNAMIC_SMEM(smem);
    const Plan l = plan_of(p, sms, smem_cap);
    __shared__ int64_t ticket;
    if (threadIdx.x == 0) ticket = atomicAdd(p.counters + l.ticket, 1);
    __syncthreads();
    run_tile<A>(p, l, ticket, smem);
  }
}

}  // namespace dcoco::cuda
