// What the tensor-core MMA policies share: operands are 16-bit (bf16 or fp16) with fp32 accumulation; a float32
// operand is split into two 16-bit planes x = hi + lo (relative residue ~2^-16), and the products
// A_hi B_hi + A_hi B_lo (+ A_lo B_hi) keep float32 weights to about float32 accuracy.
#pragma once
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>

#include "mainloop.cuh"

namespace dcoco::cuda {

// x split into planes of Elem: hi = round(x), lo = round(x - hi).
template <class Elem>
__device__ inline Elem plane_of(float x, int plane) {
  const Elem hi = Elem(x);
  return plane == 0 ? hi : Elem(x - float(hi));
}

// What the register-accumulator tensor-core policies (sm80, sm90) share: operand planes in shared memory
// laid out by LayoutA/LayoutB, accumulators partitioned by TiledMma, the epilogue's coordinates.
template <class Elem, int APlanes, int Align, class TiledMma_, class LayoutA_, class LayoutB_>
struct PlaneMma {
  static_assert(APlanes == 1 || APlanes == 2);
  using TiledMma = TiledMma_;
  using LayoutA = LayoutA_;
  using LayoutB = LayoutB_;
  struct Storage {
    alignas(Align) Elem a[APlanes][kBM * kBK];
    alignas(Align) Elem b[2][kBN * kBK];
  };
  using Acc = decltype(cute::partition_fragment_C(TiledMma{}, cute::Shape<cute::Int<kBM>, cute::Int<kBN>>{}));

  __device__ static void begin(Storage&, Acc& acc) { cute::clear(acc); }
  __device__ static void end(Storage&, Acc&) {}
  __device__ static void put_a(Storage& st, int m, int k, float x) {
    for (int i = 0; i < APlanes; ++i)
      cute::make_tensor(cute::make_smem_ptr(st.a[i]), LayoutA{})(m, k) = APlanes == 1 ? Elem(x) : plane_of<Elem>(x, i);
  }
  __device__ static void put_b(Storage& st, int n, int k, float x) {
    for (int i = 0; i < 2; ++i) cute::make_tensor(cute::make_smem_ptr(st.b[i]), LayoutB{})(n, k) = plane_of<Elem>(x, i);
  }
  template <class F>
  __device__ static void store(const Acc& acc, F&& f) {
    using namespace cute;
    auto thr = TiledMma{}.get_slice(threadIdx.x);
    Tensor coord = thr.partition_C(make_identity_tensor(Shape<Int<kBM>, Int<kBN>>{}));
    for (int i = 0; i < size(acc); ++i) f(int(get<0>(coord(i))), int(get<1>(coord(i))), acc(i));
  }
};

}  // namespace dcoco::cuda
