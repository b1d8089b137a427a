// The sm_80 tensor-core policy (cuda/sm80_mma.cuh: ldmatrix.x4 + mma.sync m16n8k16 through CuTe, Swizzle<2,3,3>
// K-major shared memory) driven through the real mainloop (tile_gemm, mainloop.cuh) in one emulated block, with
// its instructions emulated by emu_sm80.h, against a float64 product of the same 16-bit planes. Negative checks:
// shared memory written in a wrong layout (unswizzled; B transposed) must give a wrong product, or the emulation
// would not be checking the layouts. Prints one line per check; exits 0 only if every check comes out as expected.
// Built by tests/ops/test_emulated_mma.py (-DDCOCO_EMULATE_MMA).
#include "cuda_emulation.h"
// the emulation header must come first: it defines the CUDA keywords the kernel headers use
#include "tensor_cores.h"
#include "sm80_mma.cuh"

#include "unit_mma.h"

using namespace dcoco::cuda;
using namespace unit;

namespace {

// The policy with its shared memory written in another layout than the one its ldmatrix partition reads.
template <class Elem, class WriteA, class WriteB>
struct Miswritten : Sm80Mma<Elem, 1> {
  using Storage = typename Sm80Mma<Elem, 1>::Storage;
  static void put_a(Storage& st, int m, int k, float x) { cute::make_tensor(&st.a[0][0], WriteA{})(m, k) = Elem(x); }
  static void put_b(Storage& st, int n, int k, float x) {
    for (int i = 0; i < 2; ++i) cute::make_tensor(&st.b[i][0], WriteB{})(n, k) = plane_of<Elem>(x, i);
  }
};
using PlainA = cute::Layout<cute::Shape<cute::Int<kBM>, cute::Int<kBK>>, cute::Stride<cute::Int<kBK>, cute::_1>>;
using PlainB = cute::Layout<cute::Shape<cute::Int<kBN>, cute::Int<kBK>>, cute::Stride<cute::Int<kBK>, cute::_1>>;
using NMajorB = cute::Layout<cute::Shape<cute::Int<kBN>, cute::Int<kBK>>, cute::Stride<cute::_1, cute::Int<kBN>>>;

}  // namespace

int main() {
  using bf16 = cute::bfloat16_t;
  using f16 = cute::half_t;
  const Problem p = make_problem(80, 1);  // 3 k-blocks, the last one partial (zero-padded by the loaders)
  const Problem q = make_problem(32, 2);
  expect_match<Sm80Mma<bf16, 1>, bf16>("Sm80Mma<bf16,1> (K=80) vs float64 planes", p, 1);
  expect_match<Sm80Mma<bf16, 2>, bf16>("Sm80Mma<bf16,2> (K=80) vs float64 planes", p, 2);
  expect_match<Sm80Mma<f16, 1>, f16>("Sm80Mma<f16,1> (K=32) vs float64 planes", q, 1);
  using SwA = typename Sm80Mma<bf16, 1>::LayoutA;
  expect_mismatch<Miswritten<bf16, PlainA, PlainB>, bf16>("negative: smem written unswizzled, read swizzled", q, 1);
  expect_mismatch<Miswritten<bf16, SwA, NMajorB>, bf16>("negative: B written N-major (transposed), read K-major", q,
                                                        1);
  std::printf("%s\n", failures ? "unit_sm80: FAILED" : "unit_sm80: all checks as expected");
  return failures ? 1 : 0;
}
