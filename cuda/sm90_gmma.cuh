// Tensor-core MMA policy for sm_90a: wgmma (CuTe GMMA atoms) reading both operands from shared memory in
// the 64-byte-swizzled K-major layout; two warpgroups split the kBN columns. Same planes as plane_mma.cuh.
#pragma once
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/arch/barrier.h>

#include "plane_mma.cuh"

namespace dcoco::cuda {

template <class Elem>
using Sm90Atom = std::conditional_t<
    std::is_same_v<Elem, cute::bfloat16_t>,
    cute::SM90_64x64x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>,
    cute::SM90_64x64x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>>;

template <class Elem, int APlanes>
struct Sm90Mma
    : PlaneMma<Elem, APlanes, 1024,
               decltype(cute::make_tiled_mma(Sm90Atom<Elem>{}, cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>{})),
               decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<Elem>{},
                                            cute::Shape<cute::Int<kBM>, cute::Int<kBK>>{})),
               decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<Elem>{},
                                            cute::Shape<cute::Int<kBN>, cute::Int<kBK>>{}))> {
  using Base = typename Sm90Mma::PlaneMma;
  using typename Base::Acc, typename Base::LayoutA, typename Base::LayoutB, typename Base::Storage,
      typename Base::TiledMma;
  // wgmma reads shared memory through the async proxy: make this thread's generic stores visible to it
  __device__ static void publish() { cutlass::arch::fence_view_async_shared(); }
  __device__ static void mma(Storage& st, Acc& acc) {
    using namespace cute;
    TiledMma tm;
    auto thr = tm.get_slice(threadIdx.x);
    auto desc_a = [&](int i) { return thr.make_fragment_A(thr.partition_A(make_tensor(make_smem_ptr(st.a[i]), LayoutA{}))); };
    auto desc_b = [&](int i) { return thr.make_fragment_B(thr.partition_B(make_tensor(make_smem_ptr(st.b[i]), LayoutB{}))); };
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    gemm(tm, desc_a(0), desc_b(0), acc);
    gemm(tm, desc_a(0), desc_b(1), acc);
    if constexpr (APlanes == 2) gemm(tm, desc_a(1), desc_b(0), acc);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
  }
};

}  // namespace dcoco::cuda
