// The sm_100a tensor-core policy (cuda/sm100_umma.cuh: tcgen05.mma M=128 N=128 from 64-byte swizzled K-major shared
// memory into tensor memory, completed through an mbarrier, read back with tcgen05.ld 32x32b) driven through the
// real mainloop (tile_gemm, mainloop.cuh) in one emulated block, with its instructions emulated by emu_sm100.h,
// against a float64 product of the same 16-bit planes.
// Negative checks: a wrong layout or instruction descriptor (smem written unswizzled; the descriptor's N, A/B
// transposition or A type changed; the first MMA accumulating into fresh tensor memory; no tcgen05.wait::ld) must
// give a wrong product, a missing fence.proxy.async must be reported, and the protocol errors that stop the run
// (a warp reading another warp's lane quarter, reading the accumulators without waiting on the MMAs' mbarrier, a
// wrong mbarrier phase, no mbarrier.init, a TMEM double allocation or a free of a range not allocated) must exit 9:
// each runs as `unit_sm100 <mode>` in a child process. Apart from the smem writers and the missing fence (the
// policy with put_a/put_b or publish replaced), every fault is injected by a knob of emu_sm100.h into the
// instructions the real policy issues, so its own mma(), store(), begin() and end() run in every check.
// Prints one line per check; exits 0 only if every check comes out as expected. Built by tests/ops/test_emulated_mma.py.
#include "cuda_emulation.h"
// the emulation header must come first: it defines the CUDA keywords the kernel headers use
#include "tensor_cores.h"
#include "sm100_umma.cuh"

#include <sys/wait.h>

#include <cstring>
#include <string>

#include "unit_mma.h"

using namespace dcoco::cuda;
using namespace unit;

namespace {

using bf16 = cute::bfloat16_t;
using f16 = cute::half_t;
using Base = Sm100Mma<bf16, 1>;
using Storage = Base::Storage;

// The policy with its shared memory written in the plain (unswizzled) K-major layout its descriptors do not describe.
struct WrittenUnswizzled : Base {
  using PlainA = cute::Layout<cute::Shape<cute::Int<kUM>, cute::Int<kBK>>, cute::Stride<cute::Int<kBK>, cute::_1>>;
  using PlainB = cute::Layout<cute::Shape<cute::Int<kBN>, cute::Int<kBK>>, cute::Stride<cute::Int<kBK>, cute::_1>>;
  static void put_a(Storage& st, int m, int k, float x) { cute::make_tensor(&st.a[0][0], PlainA{})(m, k) = bf16(x); }
  static void put_b(Storage& st, int n, int k, float x) {
    for (int i = 0; i < 2; ++i) cute::make_tensor(&st.b[i][0], PlainB{})(n, k) = plane_of<bf16>(x, i);
  }
};

// The policy as it was: at() returned its element by value (`auto`), so every put_a/put_b store went to a copy.
struct StoresToCopies : Base {
  static void put_a(Storage& st, int m, int k, float x) { auto e = at<LayoutA>(st.a[0], m, k); e = bf16(x); }
  static void put_b(Storage& st, int n, int k, float x) {
    for (int i = 0; i < 2; ++i) {
      auto e = at<LayoutB>(st.b[i], n, k);
      e = plane_of<bf16>(x, i);
    }
  }
};

// The policy without its fence.proxy.async between the stores and the barrier.
struct Unfenced : Base {
  static void publish() {}
};

// The real policy with one emulation knob set (a fault in what it issues) must give a wrong product.
template <class T>
void expect_mismatch_with(const char* name, const Problem& p, T& knob, T value) {
  knob = value;
  expect_mismatch<Base, bf16>(name, p, 1);
  knob = T{};
}

// the runs that must stop with exit 9 (in a child process each)
struct Stop {
  const char* mode;
  const char* what;
  void (*run)(const Problem&);
};
namespace knob = emu::sm100;
const Stop kStops[] = {
    {"wrong-quarter", "negative: warp w reads TMEM lane quarter w+1 (tcgen05.ld)",
     [](const Problem& p) { knob::ld_lane_shift = 32, (void)run<Base>(p); }},
    {"no-wait", "negative: accumulators read without waiting on the MMAs' mbarrier",
     [](const Problem& p) { knob::skip_mbarrier_wait = true, (void)run<Base>(p); }},
    {"wrong-parity", "negative: every k-block waits on mbarrier parity 0",
     [](const Problem& p) { knob::wait_parity0 = true, (void)run<Base>(p); }},
    {"no-init", "negative: no mbarrier.init",
     [](const Problem& p) { knob::skip_mbarrier_init = true, (void)run<Base>(p); }},
    {"double-alloc", "negative: TMEM allocated twice, freed once",
     [](const Problem& p) { knob::extra_allocations = 1, (void)run<Base>(p); }},
    {"bad-free", "negative: tcgen05.dealloc of a range not allocated",
     [](const Problem& p) { knob::dealloc_column_shift = 32, (void)run<Base>(p); }},
};

}  // namespace

int main(int argc, char** argv) {
  emu::sm90::violation = [](const char* what) {  // recorded, not fatal: the missing-fence check expects one
    static const char* last = nullptr;
    if (what != last) std::printf("     (the emulation reports: %s)\n", what), last = what;
    ++violations;
  };
  const Problem p = make_problem(80, 1);  // 3 k-blocks, the last one partial (zero-padded by the loaders)
  const Problem q = make_problem(32, 2);
  if (argc == 2) {
    for (const Stop& s : kStops)
      if (!std::strcmp(argv[1], s.mode)) {
        s.run(p);
        std::printf("%s: ran to the end, not stopped\n", s.mode);
        return 1;
      }
    return 2;
  }
  expect_match<Sm100Mma<bf16, 1>, bf16>("Sm100Mma<bf16,1> (K=80) vs float64 planes", p, 1);
  expect_match<Sm100Mma<bf16, 2>, bf16>("Sm100Mma<bf16,2> (K=80) vs float64 planes", p, 2);
  expect_match<Sm100Mma<f16, 1>, f16>("Sm100Mma<f16,1> (K=32) vs float64 planes", q, 1);
  expect_match<Sm100Mma<f16, 2>, f16>("Sm100Mma<f16,2> (K=80) vs float64 planes", p, 2);
  expect_match<Sm100Mma<bf16, 2>, bf16>("Sm100Mma<bf16,2> (K=0: no MMA, zeros)", make_problem(0, 3), 2);
  expect_mismatch<WrittenUnswizzled, bf16>("negative: smem written unswizzled, descriptors SW64", q, 1);
  expect_mismatch<StoresToCopies, bf16>("negative: operand stores to a copy (the at() bug fixed in sm100_umma.cuh)", q, 1);
  expect_mismatch_with("negative: instruction descriptor N = 64 (not 128)", q, knob::idesc_flip, 24u << 17);
  expect_mismatch_with("negative: instruction descriptor transposes A (MN-major)", q, knob::idesc_flip, 1u << 15);
  expect_mismatch_with("negative: instruction descriptor transposes B (MN-major)", q, knob::idesc_flip, 1u << 16);
  expect_mismatch_with("negative: instruction descriptor says A and B are f16", q, knob::idesc_flip,
                       1u << 7 | 1u << 10);
  expect_mismatch_with("negative: first MMA accumulates into fresh TMEM", q, knob::accumulate_always, true);
  expect_mismatch_with("negative: registers read without tcgen05.wait::ld", q, knob::skip_wait_ld, true);
  expect_violation<Unfenced>("negative: no fence.proxy.async after the stores", p);
  for (const Stop& s : kStops) {
    std::fflush(stdout);
    const int status = std::system((std::string("'") + argv[0] + "' " + s.mode + " >/dev/null").c_str());
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 9;
    failures += !ok;
    std::printf("%-4s %-62s exit %d (must be 9: stopped by the emulation)\n", ok ? "ok" : "FAIL", s.what,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  std::printf("%s\n", failures ? "unit_sm100: FAILED" : "unit_sm100: all checks as expected");
  return failures ? 1 : 0;
}
