// Tensor-core MMA policy for sm_80 and later (mma.sync m16n8k16 via CuTe), with the 16-bit planes of
// plane_mma.cuh. sm_90a and sm_100a have their own policies (sm90_gmma.cuh, sm100_umma.cuh); this one runs on
// every other sm_80+ device, and on those two when DCOCO_CUDA_PATH=sm80 forces it.
#pragma once
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>

#include "plane_mma.cuh"

namespace dcoco::cuda {

template <class Elem>
using Sm80Atom = std::conditional_t<std::is_same_v<Elem, cute::bfloat16_t>, cute::SM80_16x8x16_F32BF16BF16F32_TN,
                                    cute::SM80_16x8x16_F32F16F16F32_TN>;
// (rows,kBK) K-major, 64-byte rows swizzled so ldmatrix reads are conflict-free
using Sm80Atom8 = decltype(cute::composition(
    cute::Swizzle<2, 3, 3>{}, cute::Layout<cute::Shape<cute::_8, cute::Int<kBK>>, cute::Stride<cute::Int<kBK>, cute::_1>>{}));

template <class Elem, int APlanes>
struct Sm80Mma
    : PlaneMma<Elem, APlanes, 128,
               // 8 warps as (2,4) over (M,N); each warp owns 16 x 16 per repeat, so ldmatrix.x4 feeds A and B
               decltype(cute::make_tiled_mma(Sm80Atom<Elem>{}, cute::Layout<cute::Shape<cute::_2, cute::_4, cute::_1>>{},
                                             cute::Tile<cute::_32, cute::_64, cute::_16>{})),
               decltype(cute::tile_to_shape(Sm80Atom8{}, cute::Shape<cute::Int<kBM>, cute::Int<kBK>>{})),
               decltype(cute::tile_to_shape(Sm80Atom8{}, cute::Shape<cute::Int<kBN>, cute::Int<kBK>>{}))> {
  using Base = typename Sm80Mma::PlaneMma;
  using typename Base::Acc, typename Base::LayoutA, typename Base::LayoutB, typename Base::Storage,
      typename Base::TiledMma;
  __device__ static void publish() {}
  __device__ static void mma(Storage& st, Acc& acc) {
    using namespace cute;
    TiledMma tm;
    auto thr = tm.get_slice(threadIdx.x);
    auto s2r_a = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Elem>{}, tm);
    auto s2r_b = make_tiled_copy_B(Copy_Atom<SM75_U32x4_LDSM_N, Elem>{}, tm);
    auto ta = s2r_a.get_slice(threadIdx.x);
    auto tb = s2r_b.get_slice(threadIdx.x);
    auto load_a = [&](int i) {
      Tensor s = make_tensor(make_smem_ptr(st.a[i]), LayoutA{});
      Tensor f = thr.partition_fragment_A(s);  // (MMA,MMA_M,MMA_K)
      copy(s2r_a, ta.partition_S(s), ta.retile_D(f));
      return f;
    };
    auto load_b = [&](int i) {
      Tensor s = make_tensor(make_smem_ptr(st.b[i]), LayoutB{});
      Tensor f = thr.partition_fragment_B(s);  // (MMA,MMA_N,MMA_K)
      copy(s2r_b, tb.partition_S(s), tb.retile_D(f));
      return f;
    };
    auto a_hi = load_a(0);
    auto b_hi = load_b(0), b_lo = load_b(1);
    gemm(tm, a_hi, b_hi, acc);
    gemm(tm, a_hi, b_lo, acc);
    if constexpr (APlanes == 2) gemm(tm, load_a(1), b_hi, acc);
  }
};

}  // namespace dcoco::cuda
