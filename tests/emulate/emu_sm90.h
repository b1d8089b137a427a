// The sm_90a instructions of cuda/sm90_gmma.cuh emulated on the CPU, from the PTX ISA (8.x numbering; the anchor of
// docs.nvidia.com/cuda/parallel-thread-execution is given too, as section numbers move between versions):
//   wgmma.mma_async.sync.aligned.m64n64k16.f32.{bf16,f16}.{bf16,f16} with both operands in shared memory (SS),
//     K-major (tnspA = tnspB = 0), any of the four descriptor layout types  CuTe SM90_64x64x16_F32{BF16BF16,F16F16}_SS
//   wgmma.fence / wgmma.commit_group / wgmma.wait_group    CuTe warpgroup_arrive / _commit_batch / _wait<N>
//   fence.proxy.async.shared::cta                          cutlass::arch::fence_view_async_shared
// wgmma is asynchronous: an issued wgmma is queued, a commit closes the thread's open batch into a group, and
// wait_group<N> executes every group but the newest N, so accumulators read before the wait hold their old values.
// Each thread computes only its own accumulator registers (the m64nNk16 D fragment), reading A and B from shared
// memory through the decoded 64-bit matrix descriptors with the descriptor's swizzle applied, never through CuTe's
// tensors: a wrong layout, swizzle or descriptor gives a wrong product. The warpgroup's threads must have issued the
// same descriptors (checked at the wait). Shared memory is read through the async proxy's view (emu::async_smem),
// which only a fence.proxy.async brings up to date: wgmma operands written without that fence are caught.
// Protocol errors (no wgmma.fence before a wgmma, operands not fenced, descriptors differing in a warpgroup) go to
// emu::sm90::violation, by default emu::unemulated (exit 7); tests/emulate/unit_sm90.cpp records them instead.
// warpgroup_fence_operand stays CuTe's host no-op: it only orders register accesses for the compiler.
//
// Hooked in through CuTe's dispatch (MMA_Atom::call's unqualified mma_unpack: the overload below for the exact
// traits is more specialised than cute::SM90::GMMA::mma_unpack). The zero-argument wgmma.fence/commit/wait
// wrappers and cutlass::arch::fence_view_async_shared (whose host branch is EMPTY, a silent no-op) cannot be
// overloaded: in this test-only code, object-like macros defined after the CuTe/CUTLASS headers are included rename
// the calls the kernel headers make to the emulations below (cute::emu_warpgroup_arrive, ...,
// cutlass::arch::emu_sm90_fence_view_async_shared).
#pragma once
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

namespace emu::sm90 {
// where protocol errors go (never returns by default)
inline void (*violation)(const char*) = [](const char* what) { emu::unemulated(what); };
}  // namespace emu::sm90

// The async proxy's view of the block's shared memory (also for the sm100 emulation, whose tcgen05.mma reads
// through the same proxy). PTX ISA 8.x 9.7.12.15 "membar/fence" (#parallel-synchronization-and-communication-
// instructions-membar), fence.proxy.async: generic-proxy writes become visible to the async proxy (wgmma operand
// reads) only after a fence.proxy.async by the writing thread. Model: a fence by any thread of the block brings the
// whole view up to date before the next async read (weaker than the GPU, which needs every writer to fence its own
// writes), and an async read whose bytes differ between the view and shared memory is a violation.
namespace emu::async_smem {
inline thread_local std::vector<char> view;
inline thread_local bool stale = false;
inline void reset_block() {
  view.assign(emu::dynamic_smem.data(), emu::dynamic_smem.data() + emu::kSpan);
  stale = false;
}
inline const bool registered = (emu::block_resets().push_back(&reset_block), true);
inline void fence() { stale = true; }
// n bytes at shared-memory offset `at`, as the async proxy sees them
inline void read(size_t at, void* dst, size_t n) {
  if (at + n > emu::dynamic_bytes) {
    emu::sm90::violation("an async-proxy read past the launch's shared memory");
    std::memset(dst, 0, n);
    return;
  }
  if (stale) std::memcpy(view.data(), emu::dynamic_smem.data(), emu::kSpan), stale = false;
  std::memcpy(dst, view.data() + at, n);
  if (std::memcmp(dst, emu::dynamic_smem.data() + at, n))
    emu::sm90::violation("wgmma read shared memory written without fence.proxy.async (fence_view_async_shared)");
}
}  // namespace emu::async_smem

namespace emu::sm90 {

// PTX ISA 9.7.15.5.1.2.2 "Matrix Descriptor Format" (#asynchronous-warpgroup-level-matrix-shared-memory-layout-
// matrix-descriptor): bits 0-13 start address >> 4, 16-29 leading dimension byte offset >> 4, 32-45 stride
// dimension byte offset >> 4, 49-51 matrix base offset, 62-63 swizzle mode (0 none, 1 128B, 2 64B, 3 32B).
struct Desc {
  uint32_t start, lbo, sbo, base, mode;
  explicit Desc(uint64_t d)
      : start(uint32_t(d & 0x3FFF) << 4),
        lbo(uint32_t((d >> 16) & 0x3FFF) << 4),
        sbo(uint32_t((d >> 32) & 0x3FFF) << 4),
        base(uint32_t((d >> 49) & 7)), mode(uint32_t(d >> 62)) {}
  // Byte offset of element (row, k) of a K-major operand of 16-bit elements, row in M (A) or N (B), k in [0,16).
  // PTX ISA 9.7.15.5.1.2 "Shared Memory Matrix Layout" (#asynchronous-warpgroup-level-matrix-shared-memory-layout):
  // the operand is made of core matrices of 8 rows x 16 bytes. Without swizzling a core matrix is 128 contiguous
  // bytes (rows 16 bytes apart), core matrices adjacent in K are LBO apart and in M/N SBO apart. With a W-byte
  // swizzle (W = 32, 64, 128) the 8 rows of a group are W bytes apart, K runs contiguously along a row (LBO unused
  // for K-major), groups of 8 rows are SBO apart, and within each 8 x W-byte pattern (aligned to it: base offset 0)
  // the 16-byte chunk index is XORed with the 128-byte line index: address bits [4, 4+log2(W/16)) ^= bits [7, ...).
  uint32_t offset(int row, int k) const {
    if (mode == 0) return start + (row / 8) * sbo + (k / 8) * lbo + (row % 8) * 16 + (k % 8) * 2;
    const uint32_t width = mode == 1 ? 128 : mode == 2 ? 64 : 32;
    const uint32_t a = start + (row / 8) * sbo + (row % 8) * width + k * 2;
    return a ^ (((a >> 7) & (width / 16 - 1)) << 4);
  }
};

// The swizzle patterns of a swizzled operand must start on a pattern boundary (8 rows x W bytes) when the base
// offset is 0: the start address's line bits [7, 7+log2(W/16)) are 0 (advancing the start along K, by less than a
// row, leaves them so). Otherwise the address-based swizzle emulated here and the hardware's row phase part ways.
inline void check(const Desc& d) {
  if (d.base) violation("wgmma: a descriptor with a nonzero matrix base offset (not emulated)");
  const uint32_t lines = d.mode == 1 ? 8 : d.mode == 2 ? 4 : d.mode == 3 ? 2 : 1;
  if ((d.start >> 7) & (lines - 1))
    violation("wgmma: a swizzled operand that does not start on its swizzle pattern (base offset 0)");
}

struct Op {  // one issued wgmma m64nNk16, as one thread of the warpgroup sees it
  uint64_t desc_a, desc_b;
  float* d[128];  // this thread's N/2 accumulator registers
  int n;
  bool accumulate, bf16;
  float scale_a, scale_b;
};
struct ThreadState {
  bool fenced = false;                  // a wgmma.fence since the last wait (or since the start)
  std::vector<Op> open;                 // issued, not yet committed
  std::deque<std::vector<Op>> groups;   // committed, oldest first
};
inline thread_local std::vector<ThreadState> threads;
inline thread_local std::vector<const std::vector<Op>*> pending;  // per thread: what its wait executes
inline void reset_block() {
  threads.assign(emu::block_dim.x, ThreadState{});
  pending.assign(emu::block_dim.x, nullptr);
}
inline const bool registered = (emu::block_resets().push_back(&reset_block), true);

inline float element(bool bf16, size_t at) {
  uint16_t bits;
  async_smem::read(at, &bits, 2);
  return bf16 ? float(cute::bfloat16_t::bitcast(bits)) : float(cute::half_t::bitcast(bits));
}

// PTX ISA 9.7.15.5.1.1 "Register Fragments" (#asynchronous-warpgroup-level-matrix-register-fragment), matrix D of
// m64nNk16 (#wgmma-64n16-d): thread t of the warpgroup (warp w = t/32, lane l) holds d_i, i in [0, N/2), at
// row = 16 w + l/4 + 8 ((i>>1)&1), col = 8 (i/4) + 2 (l%4) + (i&1). (CuTe's CLayout_64xN says the same.)
// D = A B (+ D unless scale-d is 0), A (64x16) and B (16xN) read from shared memory; fp32 accumulation.
inline void execute(const Op& op) {
  const unsigned t = threadIdx.x % 128, w = t / 32, l = t % 32;
  const Desc da(op.desc_a), db(op.desc_b);
  check(da), check(db);
  for (int i = 0; i < op.n / 2; ++i) {
    const int m = int(16 * w + l / 4 + 8 * ((i >> 1) & 1)), n = int(8 * (i / 4) + 2 * (l % 4) + (i & 1));
    float acc = op.accumulate ? *op.d[i] : 0.f;
    for (int k = 0; k < 16; ++k)
      acc += op.scale_a * element(op.bf16, da.offset(m, k)) * (op.scale_b * element(op.bf16, db.offset(n, k)));
    *op.d[i] = acc;
  }
}

// PTX ISA 9.7.15.5.2 "wgmma.mma_async" (#asynchronous-warpgroup-level-matrix-instructions-wgmma-mma-async): issue
inline void issue(const Op& op) {
  ThreadState& s = threads[threadIdx.x];
  // 9.7.15.6.1 "wgmma.fence": required before the first wgmma.mma_async and after other accesses to its registers
  if (!s.fenced) violation("wgmma.mma_async without a wgmma.fence (warpgroup_arrive) before it");
  s.open.push_back(op);
}

// 9.7.15.6.2 "wgmma.commit_group": the thread's uncommitted wgmma.mma_async operations become one wgmma-group
inline void commit_group() {
  ThreadState& s = threads[threadIdx.x];
  s.groups.push_back(std::move(s.open));
  s.open.clear();
}

// 9.7.15.6.3 "wgmma.wait_group N": wait until at most N of the thread's most recent wgmma-groups are pending (and
// every prior one complete); registers the completed wgmmas write are then readable, and need a wgmma.fence again
// before a later wgmma touches them.
inline void wait_group(int keep) {
  ThreadState& s = threads[threadIdx.x];
  std::vector<Op> run;
  while (int(s.groups.size()) > keep) {
    for (Op& op : s.groups.front()) run.push_back(op);
    s.groups.pop_front();
  }
  // .sync.aligned over the warpgroup's wgmmas: every thread must have issued the same ones (same descriptors)
  const unsigned me = threadIdx.x, lead = me / 128 * 128;
  pending[me] = &run;
  __syncwarpgroup();
  const std::vector<Op>& ref = *pending[lead];
  bool same = ref.size() == run.size();
  for (size_t i = 0; same && i < run.size(); ++i)
    same = ref[i].desc_a == run[i].desc_a && ref[i].desc_b == run[i].desc_b && ref[i].n == run[i].n &&
           ref[i].accumulate == run[i].accumulate;
  __syncwarpgroup();
  if (!same) violation("wgmma: the threads of a warpgroup issued different wgmma.mma_async (descriptors)");
  for (const Op& op : run) execute(op);
  s.fenced = false;
}

}  // namespace emu::sm90

namespace cute {

inline void emu_warpgroup_arrive() { emu::sm90::threads[threadIdx.x].fenced = true; }
inline void emu_warpgroup_commit_batch() { emu::sm90::commit_group(); }
template <int N>
inline void emu_warpgroup_wait() {
  static_assert(N >= 0 && N <= 7);
  emu::sm90::wait_group(N);
}

namespace emu_detail {
template <bool BF16, SM90::GMMA::Major tA, SM90::GMMA::Major tB, SM90::GMMA::ScaleIn sA, SM90::GMMA::ScaleIn sB,
          class Traits, class TD, class DL, class TA, class AL, class TB, class BL>
inline void wgmma_ss(Traits const& traits, Tensor<TD, DL>& D, Tensor<TA, AL> const& A, Tensor<TB, BL> const& B) {
  static_assert(tA == SM90::GMMA::Major::K && tB == SM90::GMMA::Major::K, "only K-major wgmma operands are emulated");
  static_assert(decltype(size(A))::value == 1 && decltype(size(B))::value == 1);
  Tensor rD = recast<float>(D);
  constexpr int regs = decltype(size(rD))::value;
  static_assert(regs == 32, "m64n64k16: 32 accumulator registers per thread");
  emu::sm90::Op op{};
  op.desc_a = uint64_t(A(0)), op.desc_b = uint64_t(B(0)), op.n = 2 * regs, op.bf16 = BF16;
  op.accumulate = traits.accumulate_ == SM90::GMMA::ScaleOut::One;
  op.scale_a = sA == SM90::GMMA::ScaleIn::Neg ? -1.f : 1.f, op.scale_b = sB == SM90::GMMA::ScaleIn::Neg ? -1.f : 1.f;
  for (int i = 0; i < regs; ++i) op.d[i] = &rD(i);
  emu::sm90::issue(op);
}
}  // namespace emu_detail

// GMMA's C and D are the same registers (CuTe's own SM90 mma_unpack ignores C likewise)
template <SM90::GMMA::Major tA, SM90::GMMA::Major tB, SM90::GMMA::ScaleIn sA, SM90::GMMA::ScaleIn sB, class TD,
          class DL, class TA, class AL, class TB, class BL, class TC, class CL>
inline void mma_unpack(MMA_Traits<SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<tA, tB, sA, sB>> const& traits,
                       Tensor<TD, DL>& D, Tensor<TA, AL> const& A, Tensor<TB, BL> const& B, Tensor<TC, CL> const&) {
  emu_detail::wgmma_ss<true, tA, tB, sA, sB>(traits, D, A, B);
}
template <SM90::GMMA::Major tA, SM90::GMMA::Major tB, SM90::GMMA::ScaleIn sA, SM90::GMMA::ScaleIn sB, class TD,
          class DL, class TA, class AL, class TB, class BL, class TC, class CL>
inline void mma_unpack(MMA_Traits<SM90::GMMA::MMA_64x64x16_F32F16F16_SS<tA, tB, sA, sB>> const& traits,
                       Tensor<TD, DL>& D, Tensor<TA, AL> const& A, Tensor<TB, BL> const& B, Tensor<TC, CL> const&) {
  emu_detail::wgmma_ss<false, tA, tB, sA, sB>(traits, D, A, B);
}

}  // namespace cute

namespace cutlass::arch {
inline void emu_sm90_fence_view_async_shared() { emu::async_smem::fence(); }
}  // namespace cutlass::arch

// The renames (see the top of this file): every later use of these names calls the emulations above.
#define warpgroup_arrive emu_warpgroup_arrive
#define warpgroup_commit_batch emu_warpgroup_commit_batch
#define warpgroup_wait emu_warpgroup_wait
#define fence_view_async_shared emu_sm90_fence_view_async_shared  // emu_sm100.h's MMAs read through the same view
