// The sm_90a tensor-core policy (cuda/sm90_gmma.cuh: wgmma m64n64k16 SS through CuTe, GMMA::Layout_K_SW64_Atom
// shared memory, two warpgroups over kBN) driven through the real mainloop (tile_gemm, mainloop.cuh) in one
// emulated block, with its instructions emulated by emu_sm90.h, against a float64 product of the same 16-bit
// planes. Negative checks: a wrong layout (smem written unswizzled; descriptors with another swizzle mode) must
// give a wrong product, and protocol errors (no fence.proxy.async after the stores, no wgmma.fence, operands off
// their swizzle pattern) must be reported by the emulation. Prints one line per check; exits 0 only if every check
// comes out as expected.
// Built by tests/ops/test_emulated_mma.py (-DDCOCO_EMULATE_MMA).
#include "cuda_emulation.h"
// the emulation header must come first: it defines the CUDA keywords the kernel headers use
#include "tensor_cores.h"
#include "sm90_gmma.cuh"

#include "unit_mma.h"

using namespace dcoco::cuda;
using namespace unit;

namespace {

// The policy with its shared memory written in the plain (unswizzled) K-major layout its descriptors do not describe.
template <class Elem>
struct WrittenUnswizzled : Sm90Mma<Elem, 1> {
  using Storage = typename Sm90Mma<Elem, 1>::Storage;
  using PlainA = cute::Layout<cute::Shape<cute::Int<kBM>, cute::Int<kBK>>, cute::Stride<cute::Int<kBK>, cute::_1>>;
  using PlainB = cute::Layout<cute::Shape<cute::Int<kBN>, cute::Int<kBK>>, cute::Stride<cute::Int<kBK>, cute::_1>>;
  static void put_a(Storage& st, int m, int k, float x) { cute::make_tensor(&st.a[0][0], PlainA{})(m, k) = Elem(x); }
  static void put_b(Storage& st, int n, int k, float x) {
    for (int i = 0; i < 2; ++i) cute::make_tensor(&st.b[i][0], PlainB{})(n, k) = plane_of<Elem>(x, i);
  }
};

// The policy's mma() (as in sm90_gmma.cuh, one A plane) with its descriptors' layout type replaced by `mode`
// (kKeep: as CuTe made them), with or without the wgmma.fence before the first wgmma and the wgmma.wait_group after.
constexpr int kKeep = -1;
template <class Elem, int mode, bool arrive, bool wait = true>
struct Variant : Sm90Mma<Elem, 1> {
  using Base = Sm90Mma<Elem, 1>;
  using typename Base::Acc, typename Base::LayoutA, typename Base::LayoutB, typename Base::Storage,
      typename Base::TiledMma;
  static void mma(Storage& st, Acc& acc) {
    using namespace cute;
    TiledMma tm;
    auto thr = tm.get_slice(threadIdx.x);
    auto patch = [](auto t) {
      GMMA::DescriptorIterator it = t.data();
      if (mode != kKeep) it.desc_.bitfield.layout_type_ = uint8_t(mode);
      return make_tensor(it, t.layout());
    };
    auto desc_a = [&](int i) {
      return patch(thr.make_fragment_A(thr.partition_A(make_tensor(make_smem_ptr(st.a[i]), LayoutA{}))));
    };
    auto desc_b = [&](int i) {
      return patch(thr.make_fragment_B(thr.partition_B(make_tensor(make_smem_ptr(st.b[i]), LayoutB{}))));
    };
    warpgroup_fence_operand(acc);
    if (arrive) warpgroup_arrive();
    gemm(tm, desc_a(0), desc_b(0), acc);
    gemm(tm, desc_a(0), desc_b(1), acc);
    warpgroup_commit_batch();
    if (wait) warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
  }
};

// The policy without its fence.proxy.async between the stores and the barrier.
template <class Elem>
struct Unfenced : Sm90Mma<Elem, 1> {
  static void publish() {}
};

}  // namespace

int main() {
  using bf16 = cute::bfloat16_t;
  using f16 = cute::half_t;
  emu::sm90::violation = [](const char* what) {  // recorded, not fatal: the negative checks expect some
    static const char* last = nullptr;
    if (what != last) std::printf("     (in the check below the emulation reports: %s)\n", what), last = what;
    ++violations;
  };
  const Problem p = make_problem(80, 1);  // 3 k-blocks, the last one partial (zero-padded by the loaders)
  const Problem q = make_problem(32, 2);
  expect_match<Sm90Mma<bf16, 1>, bf16>("Sm90Mma<bf16,1> (K=80) vs float64 planes", p, 1);
  expect_match<Sm90Mma<bf16, 2>, bf16>("Sm90Mma<bf16,2> (K=80) vs float64 planes", p, 2);
  expect_match<Sm90Mma<f16, 1>, f16>("Sm90Mma<f16,1> (K=32) vs float64 planes", q, 1);
  expect_match<Variant<bf16, kKeep, true>, bf16>("the policy's mma() replayed here (control of the variants)", q, 1);
  expect_mismatch<Variant<bf16, kKeep, true, false>, bf16>("negative: accumulators read without wgmma.wait_group", q, 1);
  expect_mismatch<WrittenUnswizzled<bf16>, bf16>("negative: smem written unswizzled, descriptors SW64", q, 1);
  expect_mismatch<Variant<bf16, int(cute::GMMA::LayoutType::B32), true>, bf16>(
      "negative: SW64 smem, descriptors saying 32B swizzle", q, 1);
  expect_mismatch<Variant<bf16, int(cute::GMMA::LayoutType::B128), true>, bf16>(
      "negative: SW64 smem, descriptors saying 128B swizzle", q, 1);
  expect_violation<Unfenced<bf16>>("negative: no fence.proxy.async after the stores", q);
  expect_violation<Variant<bf16, kKeep, false>>("negative: no wgmma.fence before the wgmmas", q);
  expect_violation<Sm90Mma<bf16, 1>>("negative: operands 128 bytes off their swizzle pattern", q, 128);
  std::printf("%s\n", failures ? "unit_sm90: FAILED" : "unit_sm90: all checks as expected");
  return failures ? 1 : 0;
}
