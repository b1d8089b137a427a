// Tensor-core MMA policy for sm_100a: tcgen05.mma (CuTe UMMA atoms) from shared memory into tensor memory,
// issued by one warp and completed through an mbarrier; the epilogue reads the accumulators back with
// tcgen05.ld. UMMA's M is 128 for one CTA: rows kBM..127 of A stay zero (this path is bound by memory
// and latency, not by MMA rate). Same 16-bit planes as plane_mma.cuh.
#pragma once
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_traits_sm100.hpp>
#include <cute/arch/tmem_allocator_sm100.hpp>
#include <cutlass/arch/barrier.h>

#include "plane_mma.cuh"

namespace dcoco::cuda {

template <class Elem, int APlanes>
struct Sm100Mma {
  static_assert(APlanes == 1 || APlanes == 2);
  static constexpr int kUM = 128;  // UMMA M
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM100_MMA_F16BF16_SS<Elem, Elem, float, kUM, kBN, cute::UMMA::Major::K, cute::UMMA::Major::K>{}));
  // operands in the post-partitioned shape ((M,16), 1, kBK/16) the MMA expects, 64-byte swizzled K-major
  using LayoutA = decltype(cute::UMMA::tile_to_mma_shape(
      cute::UMMA::Layout_K_SW64_Atom<Elem>{},
      cute::partition_shape_A(TiledMma{}, cute::Shape<cute::Int<kUM>, cute::Int<kBK>>{})));
  using LayoutB = decltype(cute::UMMA::tile_to_mma_shape(
      cute::UMMA::Layout_K_SW64_Atom<Elem>{},
      cute::partition_shape_B(TiledMma{}, cute::Shape<cute::Int<kBN>, cute::Int<kBK>>{})));
  struct Storage {
    alignas(1024) Elem a[APlanes][kUM * kBK];
    alignas(1024) Elem b[2][kBN * kBK];
    alignas(16) uint64_t done;  // MMAs of one k-block completed
    alignas(16) uint32_t tmem;  // accumulator columns
  };
  struct Acc {
    uint32_t tmem, phase;
    bool empty;  // no MMA issued yet: the accumulators hold garbage, the result is zero
  };

  // element (m,k) of an operand tile in its partitioned shape
  template <class Layout>
  __device__ static decltype(auto) at(Elem* base, int m, int k) {  // a reference: put_a/put_b store through it
    return cute::make_tensor(cute::make_smem_ptr(base), Layout{})(cute::make_coord(cute::make_coord(m, k % 16), 0, k / 16));
  }

  __device__ static void begin(Storage& st, Acc& acc) {
    if (threadIdx.x / 32 == 0) cute::TMEM::Allocator1Sm().allocate(kBN, &st.tmem);
    if (threadIdx.x == 0) cute::initialize_barrier(st.done, 1);
    for (int j = threadIdx.x; j < (kUM - kBM) * kBK; j += kThreads)  // the padding rows, once per tile
      for (int i = 0; i < APlanes; ++i) at<LayoutA>(st.a[i], kBM + j / kBK, j % kBK) = Elem(0.f);
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::fence_barrier_init();
    __syncthreads();
    acc = {st.tmem, 0, true};
  }
  __device__ static void put_a(Storage& st, int m, int k, float x) {
    for (int i = 0; i < APlanes; ++i) at<LayoutA>(st.a[i], m, k) = APlanes == 1 ? Elem(x) : plane_of<Elem>(x, i);
  }
  __device__ static void put_b(Storage& st, int n, int k, float x) {
    for (int i = 0; i < 2; ++i) at<LayoutB>(st.b[i], n, k) = plane_of<Elem>(x, i);
  }
  __device__ static void publish() { cutlass::arch::fence_view_async_shared(); }

  __device__ static auto accumulators(const TiledMma& tm, uint32_t tmem) {
    auto thr = tm.get_slice(0);
    auto c = thr.make_fragment_C(thr.partition_C(cute::make_identity_tensor(cute::Shape<cute::Int<kUM>, cute::Int<kBN>>{})));
    c.data() = tmem;
    return c;
  }

  __device__ static void mma(Storage& st, Acc& acc) {
    using namespace cute;
    if (threadIdx.x / 32 == 0) {
      TiledMma tm;
      tm.accumulate_ = acc.empty ? UMMA::ScaleOut::Zero : UMMA::ScaleOut::One;
      auto thr = tm.get_slice(0);
      auto c = accumulators(tm, acc.tmem);
      auto a = [&](int i) { return thr.make_fragment_A(make_tensor(make_smem_ptr(st.a[i]), LayoutA{})); };
      auto b = [&](int i) { return thr.make_fragment_B(make_tensor(make_smem_ptr(st.b[i]), LayoutB{})); };
      auto product = [&](auto fa, auto fb) {
        for (int k = 0; k < size<2>(fa); ++k) {
          gemm(tm, fa(_, _, k), fb(_, _, k), c);
          tm.accumulate_ = UMMA::ScaleOut::One;
        }
      };
      product(a(0), b(0));
      product(a(0), b(1));
      if constexpr (APlanes == 2) product(a(1), b(0));
      cutlass::arch::umma_arrive(&st.done);
    }
    cute::wait_barrier(st.done, acc.phase);  // the storage may be overwritten after this
    acc.phase ^= 1, acc.empty = false;
  }

  template <class F>
  __device__ static void store(const Acc& acc, F&& f) {
    using namespace cute;
    if (threadIdx.x >= 128) return;  // tcgen05.ld: warp w reads TMEM lanes 32w..32w+31, i.e. rows
    TiledMma tm;
    auto c = accumulators(tm, acc.tmem);
    auto coord = tm.get_slice(0).partition_C(make_identity_tensor(Shape<Int<kUM>, Int<kBN>>{}));
    auto t2r = make_tmem_copy(SM100_TMEM_LOAD_32dp32b1x{}, c);
    auto thr = t2r.get_slice(threadIdx.x);
    Tensor src = thr.partition_S(c);
    Tensor where = thr.partition_D(coord);
    Tensor v = make_tensor<float>(shape(where));
    if (!acc.empty) {
      copy(t2r, src, v);
      cutlass::arch::fence_view_async_tmem_load();  // tcgen05.wait::ld: v is undefined until the loads complete
    }
    for (int i = 0; i < size(v); ++i)
      if (int(get<0>(where(i))) < kBM) f(int(get<0>(where(i))), int(get<1>(where(i))), acc.empty ? 0.f : v(i));
  }

  __device__ static void end(Storage&, Acc& acc) {
    __syncthreads();  // every read of the accumulators is done
    if (threadIdx.x / 32 == 0) {
      cute::TMEM::Allocator1Sm alloc;
      alloc.release_allocation_lock();
      alloc.free(acc.tmem, kBN);
    }
  }
};
static_assert(sizeof(Sm100Mma<cute::bfloat16_t, 2>::Storage) <= kMmaSmem);

}  // namespace dcoco::cuda
