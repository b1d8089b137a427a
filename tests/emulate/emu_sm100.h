// The sm_100a tensor-core instructions cuda/sm100_umma.cuh uses, emulated on the CPU from the PTX ISA's
// documented semantics (sections cited where each is written, by name; "PTX" = the PTX ISA 9.0: chapter 9.7.16
// "TensorCore 5th Generation Family Instructions", and "mbarrier" / "elect.sync" / "membar/fence" of 9.7.13).
// Per block (reset through emu::block_resets()): the tensor memory (128 lanes x 512 columns of 32-bit cells), its
// allocations, the MMAs issued but not yet completed and each thread's tcgen05.ld results not yet waited for; the MMAs
// read shared memory through emu_sm90.h's async-proxy view. mbarrier state lives IN its 8-byte shared-memory word.
//
// A use the GPU leaves undefined or that would hang (a lane-quarter violation, a double allocation, a read of
// accumulators an MMA is still writing, a wait that can never complete, ...) prints "emulated sm100: ..." and
// exits 9. A feature the policy does not use (M=64, f16 accumulators, a non-zero matrix base offset, ...) is
// "not emulated" (exit 7).
//
// How the calls are intercepted (test-only code):
//   * tcgen05.mma: explicit specializations of SM100_MMA_F16BF16_SS<...>::fma (the K-major bf16/f16 -> f32 atoms).
//   * tcgen05.ld 32x32b.x1: a copy_unpack overload for Copy_Traits<SM100_TMEM_LOAD_32dp32b1x>, more specialized
//     than CuTe's, found by ADL from Copy_Atom::call.
//   * CuTe/CUTLASS functions whose host build is a SILENT no-op (initialize_barrier, wait_barrier, umma_arrive,
//     fence_barrier_init, fence_view_async_tmem_load; fence_view_async_shared is emu_sm90.h's) and the TMEM allocator class
//     (whose members have no overloadable form): object-like redirect macros to emu_* replacements, defined after
//     every CuTe/CUTLASS header the kernels include has been parsed here (#pragma once keeps them from being
//     re-parsed under the macros).
#pragma once
#if defined(DCOCO_EMULATE_MMA)
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_traits_sm100.hpp>
#include <cute/atom/copy_traits_sm100.hpp>
#include <cute/arch/mma_sm100_umma.hpp>
#include <cute/arch/copy_sm100.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/tmem_allocator_sm100.hpp>
#include <cutlass/arch/barrier.h>

#include "emu_sm90.h"  // fence.proxy.async and the async proxy's view of shared memory (emu::async_smem)

#include <cstdarg>
#include <cstring>
#include <vector>

namespace emu::sm100 {

inline bool failing = false;  // fail() is exiting: the tensor-memory leak check at thread exit stays quiet
[[noreturn]] inline void fail(const char* fmt, ...) {
  failing = true;
  std::va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "emulated sm100: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::exit(9);
}

constexpr int kLanes = 128, kColumns = 512;
constexpr uint32_t kPoison = 0x7fbadbadu;  // a NaN: what unwritten tensor memory and not-yet-loaded registers hold

struct Mma {  // one tcgen05.mma.cta_group::1.kind::f16 as issued
  uint64_t da, db;
  uint32_t d, enable_input_d, idesc;
};
struct Group {  // a tcgen05.commit: the MMAs it tracks and the mbarrier it arrives on once they complete
  uint32_t bar;
  std::vector<Mma> ops;
};
struct Load {  // a tcgen05.ld whose destination register is written at tcgen05.wait::ld
  uint32_t* reg;
  uint32_t value;
};
struct State {
  uint32_t cell[kLanes][kColumns];
  int owner[kColumns];  // allocation id of each column, 0: free
  int next_id = 1, alloc_warp = -1, allocated = 0;
  bool relinquished = false;
  std::vector<std::vector<Mma>> uncommitted;  // per CUDA thread: issued, not yet committed
  std::vector<Group> in_flight;               // committed, not yet complete (in commit order)
  std::vector<std::vector<Load>> loads;       // per CUDA thread
  std::vector<uint64_t> collective;           // per CUDA thread: the operands of a warp-collective instruction
  unsigned long long stalled = 0;             // polls of incomplete mbarriers since the last progress
  ~State() {  // the OS thread's last block: it must not exit holding tensor memory either
    if (allocated && !failing) {
      std::fprintf(stderr, "emulated sm100: a block exited holding %d tensor-memory columns (tcgen05.dealloc all "
                   "before exit, PTX tcgen05.alloc)\n", allocated);
      std::fflush(stderr);
      std::_Exit(9);
    }
  }
};
inline thread_local State* state = nullptr;  // the block this OS thread runs

// Test knobs (tests/emulate/unit_sm100.cpp): faults injected into the instructions the real policy issues, each a
// bug the unit test must see as a wrong product or a stop. All off by default.
inline uint32_t idesc_flip = 0;            // bits flipped in every issued instruction descriptor
inline bool accumulate_always = false;     // every tcgen05.mma adds to D, the first one to fresh tensor memory too
inline bool skip_mbarrier_init = false;    // mbarrier.init does nothing
inline bool skip_mbarrier_wait = false;    // mbarrier.try_wait.parity returns at once
inline bool wait_parity0 = false;          // mbarrier.try_wait.parity waits on parity 0, whatever it is given
inline uint32_t ld_lane_shift = 0;         // tcgen05.ld addresses lanes this much further (another warp's quarter)
inline bool skip_wait_ld = false;          // tcgen05.wait::ld does nothing: the registers keep their poison
inline int extra_allocations = 0;          // Allocator1Sm::allocate allocates this many times more (never freed)
inline uint32_t dealloc_column_shift = 0;  // Allocator1Sm::free frees columns this much further on

inline unsigned tid() { return emu::current->idx.x; }

inline void reset() {
  static thread_local std::unique_ptr<State> mine;
  if (mine && mine->allocated)
    fail("a block exited holding %d tensor-memory columns (tcgen05.dealloc all before exit, PTX tcgen05.alloc)",
         mine->allocated);
  if (!mine) mine.reset(new State);
  State& s = *mine;
  for (auto& lane : s.cell)
    for (auto& c : lane) c = kPoison;
  std::memset(s.owner, 0, sizeof s.owner);
  s.next_id = 1, s.alloc_warp = -1, s.allocated = 0, s.relinquished = false, s.stalled = 0;
  const unsigned n = emu::block_dim.x;
  s.uncommitted.assign(n, {}), s.in_flight.clear(), s.loads.assign(n, {}), s.collective.assign(n, 0);
  state = &s;
}
inline const bool registered = (emu::block_resets().push_back(&reset), true);

// A .sync.aligned instruction: every lane of the warp executes it with the same operands (`key`); lane 0 then
// performs it once.
template <class F>
inline void warp_collective(const char* what, uint64_t key, F&& once) {
  State& s = *state;
  const unsigned me = tid(), w0 = me / 32 * 32;
  s.collective[me] = key;
  __syncwarp();
  if (me == w0) {
    for (unsigned i = w0; i < w0 + 32 && i < s.collective.size(); ++i)
      if (s.collective[i] != key) fail("%s: lanes of warp %u gave different operands (.sync.aligned)", what, me / 32);
    once();
  }
  __syncwarp();
}

// ---- shared memory -------------------------------------------------------------------------------------------
inline uint32_t smem_offset(const void* p, size_t bytes, const char* what) {
  const size_t off = __cvta_generic_to_shared(p);
  if (off + bytes > emu::dynamic_bytes) fail("%s at shared offset %zu, past the launch's %zu bytes", what, off, emu::dynamic_bytes);
  return uint32_t(off);
}

// ---- mbarrier (PTX "mbarrier": "Size and alignment of mbarrier object", "Contents of the mbarrier object") -----
// The 64-bit object is 8 bytes, 8-byte aligned, in shared memory; its state (current phase, pending and expected
// arrival counts) is kept in the word itself:
//   bits 0-19 expected arrivals, 20-39 pending arrivals of the current phase, 40 current phase parity,
//   48-63 kMagic (set by mbarrier.init: a wait or arrive on a word without it is a missing init / wrong address).
constexpr uint64_t kMagic = 0xB17Eull << 48, kCount = (1ull << 20) - 1;

inline uint64_t& barrier_word(uint32_t off, const char* what) {
  if (off % 8) fail("%s: mbarrier at shared offset %u is not 8-byte aligned", what, off);
  if (off + 8 > emu::dynamic_bytes) fail("%s: mbarrier at shared offset %u outside the launch's shared memory", what, off);
  uint64_t& w = *reinterpret_cast<uint64_t*>(emu::dynamic_smem.data() + off);
  if ((w & (0xFFFFull << 48)) != kMagic) fail("%s: mbarrier at shared offset %u was never initialized (mbarrier.init)", what, off);
  return w;
}
// PTX mbarrier.init: expected count = count, pending = count, phase 0
inline void mbarrier_init(uint64_t* p, int count) {
  if (skip_mbarrier_init) return;
  const uint32_t off = smem_offset(p, 8, "mbarrier.init");
  if (off % 8) fail("mbarrier.init: shared offset %u is not 8-byte aligned", off);
  if (count < 1 || uint64_t(count) > kCount) fail("mbarrier.init: count %d outside [1, 2^20-1]", count);
  *p = kMagic | uint64_t(count) | uint64_t(count) << 20;
}
// PTX mbarrier.arrive (one arrival; "Phase completion of the mbarrier object"): the phase completes when pending reaches zero; pending is reloaded
// with the expected count and the phase parity flips.
inline void mbarrier_arrive(uint32_t off, const char* what) {
  uint64_t& w = barrier_word(off, what);
  const uint64_t expected = w & kCount, pending = (w >> 20) & kCount, parity = (w >> 40) & 1;
  if (pending == 0) fail("%s: mbarrier at %u has no pending arrival", what, off);
  state->stalled = 0;
  w = pending == 1 ? kMagic | expected | expected << 20 | (parity ^ 1) << 40
                   : kMagic | expected | (pending - 1) << 20 | parity << 40;
}

// ---- tensor memory and tcgen05.mma -----------------------------------------------------------------------------
// TMEM address (PTX "Tensor Memory Addressing"): bits 31-16 lane, 15-0 column.
inline void check_columns(uint32_t col, uint32_t n, const char* what) {
  State& s = *state;
  if (col + n > uint32_t(kColumns)) fail("%s: columns %u..%u past the 512 of tensor memory", what, col, col + n - 1);
  for (uint32_t c = col; c < col + n; ++c)
    if (!s.owner[c]) fail("%s: tensor-memory column %u is not allocated (tcgen05.alloc)", what, c);
}

struct Idesc {  // PTX 9.7.16.4.2 "Instruction descriptor", Table 42 (.kind::f16)
  int m, n, a_fmt, b_fmt, d_fmt;
  bool a_neg, b_neg, a_mn, b_mn;
};
inline Idesc decode_idesc(uint32_t i) {
  Idesc d;
  if (i & 0x7) emu::unemulated("tcgen05.mma: sparse instruction descriptor (bits 0-2)");
  if (i & (1u << 3)) fail("tcgen05.mma: saturate (bit 3) is not valid for .kind::f16");
  if (i & (1u << 6 | 1u << 23 | 1u << 29)) fail("tcgen05.mma: reserved instruction-descriptor bit set (%#x)", i);
  if (i >> 30) fail("tcgen05.mma: max shift (bits 30-31) is only for .ws");
  d.d_fmt = (i >> 4) & 3, d.a_fmt = (i >> 7) & 7, d.b_fmt = (i >> 10) & 7;
  d.a_neg = (i >> 13) & 1, d.b_neg = (i >> 14) & 1, d.a_mn = (i >> 15) & 1, d.b_mn = (i >> 16) & 1;
  d.n = int((i >> 17) & 0x3f) << 3, d.m = int((i >> 24) & 0x1f) << 4;
  if (d.d_fmt != 1) emu::unemulated("tcgen05.mma: accumulator format other than F32");
  if (d.a_fmt > 1 || d.b_fmt > 1 || d.a_fmt != d.b_fmt) fail("tcgen05.mma .kind::f16: atype/btype %d/%d (F16 0, BF16 1)", d.a_fmt, d.b_fmt);
  // PTX 9.7.16.2.1 Table 39: cta_group::1 dense .kind::f16: M in {64,128}, N in 8..256 step 8, K = 16
  if (d.m == 64) emu::unemulated("tcgen05.mma: M = 64 (its D layout in tensor memory)");
  if (d.m != 128) fail("tcgen05.mma cta_group::1: M = %d (64 or 128)", d.m);
  if (d.n < 8 || d.n > 256) fail("tcgen05.mma: N = %d outside 8..256", d.n);
  return d;
}

struct Sdesc {  // PTX 9.7.16.4.1 "Shared memory descriptor", Table 40
  uint32_t start, lbo, sbo, chunks;  // chunks: 16-byte units per swizzle row (1: no swizzle)
};
inline Sdesc decode_sdesc(uint64_t d, const char* which) {
  Sdesc s;
  s.start = uint32_t(d & 0x3fff) << 4, s.lbo = uint32_t((d >> 16) & 0x3fff) << 4, s.sbo = uint32_t((d >> 32) & 0x3fff) << 4;
  if ((d >> 14) & 3 || (d >> 30) & 3) fail("tcgen05.mma: reserved bits of the %s descriptor set", which);
  if (((d >> 46) & 7) != 1) fail("tcgen05.mma: %s descriptor bits 46-48 are %llu, not the fixed 0b001 (sm100 version)", which, (unsigned long long)((d >> 46) & 7));
  if ((d >> 49) & 7) emu::unemulated("tcgen05.mma: a non-zero matrix base offset (swizzle pattern not aligned)");
  if ((d >> 52) & 1) emu::unemulated("tcgen05.mma: leading-dimension absolute address mode");
  if ((d >> 53) & 0xff) fail("tcgen05.mma: %s descriptor bits 53-60 must be 0", which);
  switch (d >> 61) {  // swizzling mode
    case 0: s.chunks = 1; break;
    case 6: s.chunks = 2; break;  // 32-byte
    case 4: s.chunks = 4; break;  // 64-byte
    case 2: s.chunks = 8; break;  // 128-byte
    case 1: emu::unemulated("tcgen05.mma: 128-byte swizzling with 32-byte atomicity");
    default: fail("tcgen05.mma: invalid swizzling mode %llu in the %s descriptor", (unsigned long long)(d >> 61), which);
  }
  return s;
}

// Byte address of element (row, k) (row along M or N, k in [0,16)) of a 16-bit operand: the canonical layouts
// (PTX 9.7.16.3 "Major-ness supported by Strides" and the "Shared Memory Matrix Layout" canonical layouts, as CuTe's
// make_umma_desc writes them), in 16-byte units with T = 8 elements each, S = chunks per swizzle row:
//   K-major  none   row%8 * 16 + row/8 * SBO + k/8 * LBO
//   K-major  SW32/64/128  row%8 * 16S + row/8 * SBO + k/8 * 16 (LBO unused for swizzled K-major)
//   MN-major none   (row/8) * SBO + k%8 * 16 + k/8 * LBO
//   MN-major swizzled  (row/8)%S * 16 + (row/8)/S * LBO + k%8 * 16S + k/8 * SBO
// then, for a swizzled layout, the 16-byte chunk bits [4, 4+log2 S) of the absolute shared address are XORed with
// bits [7, 7+log2 S) (Swizzle<log2 S,4,3>: the repeating pattern starts on a 256/512/1024-byte boundary, Table 41,
// which is what a zero base offset asserts).
inline uint32_t element_address(const Sdesc& s, bool mn_major, int row, int k) {
  constexpr int T = 8;
  uint32_t off;
  if (!mn_major) {
    off = s.chunks == 1 ? uint32_t(row % 8 * 16 + row / 8 * s.sbo + k / T * s.lbo)
                        : uint32_t(row % 8 * 16 * s.chunks + row / 8 * s.sbo + k / T * 16);
    off += k % T * 2;
  } else {
    const int mc = row / T;
    off = s.chunks == 1 ? uint32_t(mc * s.sbo + k % 8 * 16 + k / 8 * s.lbo)
                        : uint32_t(mc % s.chunks * 16 + mc / s.chunks * s.lbo + k % 8 * 16 * s.chunks + k / 8 * s.sbo);
    off += row % T * 2;
  }
  uint32_t a = s.start + off;
  if (s.chunks > 1) a ^= ((a >> 7) & (s.chunks - 1)) << 4;
  return a;
}

inline float operand(uint32_t addr, int fmt) {
  if (addr + 2 > emu::dynamic_bytes) fail("tcgen05.mma: operand byte %u past the launch's shared memory", addr);
  uint16_t bits;
  emu::async_smem::read(addr, &bits, 2);  // through the async proxy, with its missing-fence check
  return fmt == 1 ? float(cute::bfloat16_t::bitcast(bits)) : float(cute::half_t::bitcast(bits));
}

// PTX tcgen05.mma (cta_group::1, kind::f16): D[m][n] = sum_k A[m][k] B[n][k] (+ D when enable-input-d),
// A M x K and B N x K (K = 16) from shared memory, D (f32) in tensor memory at lane m (M = 128: lanes 0-127, PTX
// "Data path layout organization", layout for M = 128 cta_group::1), column base + n. Products in float, accumulated in float.
inline void execute(const Mma& op) {
  State& s = *state;
  const Idesc id = decode_idesc(op.idesc);
  const Sdesc a = decode_sdesc(op.da, "A"), b = decode_sdesc(op.db, "B");
  const uint32_t lane = op.d >> 16, col = op.d & 0xffff;
  if (lane != 0) fail("tcgen05.mma M=128: D at lane %u, not 0", lane);
  check_columns(col, id.n, "tcgen05.mma D");
  float av[128][16], bv[256][16];
  for (int m = 0; m < id.m; ++m)
    for (int k = 0; k < 16; ++k) av[m][k] = (id.a_neg ? -1.f : 1.f) * operand(element_address(a, id.a_mn, m, k), id.a_fmt);
  for (int n = 0; n < id.n; ++n)
    for (int k = 0; k < 16; ++k) bv[n][k] = (id.b_neg ? -1.f : 1.f) * operand(element_address(b, id.b_mn, n, k), id.b_fmt);
  for (int m = 0; m < id.m; ++m)
    for (int n = 0; n < id.n; ++n) {
      float acc = 0.f;
      for (int k = 0; k < 16; ++k) acc += av[m][k] * bv[n][k];
      uint32_t& cell = s.cell[m][col + n];
      float d;
      std::memcpy(&d, &cell, 4);
      d = op.enable_input_d ? d + acc : acc;
      std::memcpy(&cell, &d, 4);
    }
}

// Issue (one elected thread, see SM100_MMA_F16BF16_SS::fma): validated now, executed when its commit group
// completes, i.e. when a thread first observes the commit's mbarrier (so shared memory changed between the issue
// and the wait is what the MMA reads, as it may on the GPU).
inline void issue(uint64_t da, uint64_t db, uint32_t d, uint32_t scale, uint32_t idesc) {
  idesc ^= idesc_flip;
  if (accumulate_always) scale = 1;
  const Idesc id = decode_idesc(idesc);
  decode_sdesc(da, "A"), decode_sdesc(db, "B");
  check_columns(d & 0xffff, id.n, "tcgen05.mma D");
  state->uncommitted[tid()].push_back({da, db, d, scale, idesc});
  state->stalled = 0;
}

// Complete every commit group up to the last one that arrives on `bar` (in order: MMAs on one accumulator are
// pipelined, PTX 9.7.16.6.2), then their arrivals.
inline void complete_through(uint32_t bar) {
  State& s = *state;
  size_t last = s.in_flight.size();
  for (size_t i = 0; i < s.in_flight.size(); ++i)
    if (s.in_flight[i].bar == bar) last = i;
  if (last == s.in_flight.size()) return;
  std::vector<Group> done(s.in_flight.begin(), s.in_flight.begin() + last + 1);
  s.in_flight.erase(s.in_flight.begin(), s.in_flight.begin() + last + 1);
  for (auto& g : done) {
    for (auto& op : g.ops) execute(op);
    mbarrier_arrive(g.bar, "tcgen05.commit.mbarrier::arrive::one");
  }
}

// A write of tensor-memory column c not yet performed (issued or committed, not complete)?
inline bool pending_write(uint32_t c) {
  State& s = *state;
  auto hits = [&](const Mma& op) {
    const uint32_t col = op.d & 0xffff, n = uint32_t((op.idesc >> 17) & 0x3f) << 3;
    return c >= col && c < col + n;
  };
  for (auto& g : s.in_flight)
    for (auto& op : g.ops)
      if (hits(op)) return true;
  for (auto& v : s.uncommitted)
    for (auto& op : v)
      if (hits(op)) return true;
  return false;
}

// ---- the instruction wrappers ------------------------------------------------------------------------------------

// elect.sync 0xffffffff (PTX elect.sync): every lane waits for the whole warp; the same (here the lowest)
// lane is elected each time.
inline bool elect_one() {
  __syncwarp();
  return tid() % 32 == 0;
}

// PTX tcgen05.alloc / dealloc / relinquish_alloc_permit (cta_group::1, .sync.aligned: a whole warp).
// alloc: nCols a power of 2 in [32, 512]; the address (lane 0, first column) is written to shared memory at dst.
// The emulation places an allocation on a multiple of its size; a request that cannot be met would block forever.
inline void tmem_alloc(uint32_t* dst, int ncols) {
  const uint32_t off = smem_offset(dst, 4, "tcgen05.alloc destination");
  warp_collective("tcgen05.alloc", uint64_t(off) << 32 | uint32_t(ncols), [&] {
    State& s = *state;
    const int warp = int(tid() / 32);
    if (s.relinquished) fail("tcgen05.alloc after tcgen05.relinquish_alloc_permit");
    if (ncols < 32 || ncols > kColumns || (ncols & (ncols - 1))) fail("tcgen05.alloc: nCols %d (a power of 2 in 32..512)", ncols);
    if (s.alloc_warp >= 0 && s.alloc_warp != warp) fail("tcgen05.alloc from warp %d after warp %d allocated", warp, s.alloc_warp);
    s.alloc_warp = warp;
    for (int c0 = 0; c0 < kColumns; c0 += ncols) {
      bool free = true;
      for (int c = c0; c < c0 + ncols; ++c) free &= !s.owner[c];
      if (!free) continue;
      const int id = s.next_id++;
      for (int c = c0; c < c0 + ncols; ++c) {
        s.owner[c] = id;
        for (auto& lane : s.cell) lane[c] = kPoison;  // fresh tensor memory holds garbage
      }
      s.allocated += ncols;
      *dst = uint32_t(c0);  // lane 0
      return;
    }
    fail("tcgen05.alloc of %d columns with %d of 512 allocated: it would block forever (double allocation?)", ncols, s.allocated);
  });
}
inline void tmem_dealloc(uint32_t taddr, int ncols) {
  warp_collective("tcgen05.dealloc", uint64_t(taddr) << 32 | uint32_t(ncols), [&] {
    State& s = *state;
    const uint32_t col = taddr & 0xffff;
    if (taddr >> 16) fail("tcgen05.dealloc: address %#x has a non-zero lane", taddr);
    if (ncols < 32 || ncols > kColumns || (ncols & (ncols - 1))) fail("tcgen05.dealloc: nCols %d", ncols);
    if (col + ncols > uint32_t(kColumns)) fail("tcgen05.dealloc: columns %u.. past 512", col);
    const int id = s.owner[col];
    if (!id) fail("tcgen05.dealloc of column %u, which is not allocated", col);
    for (uint32_t c = 0; c < uint32_t(kColumns); ++c)
      if ((c >= col && c < col + ncols) != (s.owner[c] == id))
        fail("tcgen05.dealloc of columns %u..%u: not exactly one allocation", col, col + ncols - 1);
    for (uint32_t c = col; c < col + ncols; ++c)
      if (pending_write(c)) fail("tcgen05.dealloc of column %u while an MMA writing it is in flight", c);
    for (uint32_t c = col; c < col + ncols; ++c) s.owner[c] = 0;
    s.allocated -= ncols;
  });
}
inline void tmem_relinquish() {
  warp_collective("tcgen05.relinquish_alloc_permit", 0, [] { state->relinquished = true; });
}

// PTX tcgen05.commit.cta_group::1.mbarrier::arrive::one: the mbarrier tracks the completion of all prior
// async tcgen05 operations (here: MMAs) initiated by the executing thread; one arrive when they complete.
inline void commit(const uint64_t* bar) {
  const uint32_t off = smem_offset(bar, 8, "tcgen05.commit mbarrier");
  barrier_word(off, "tcgen05.commit");
  State& s = *state;
  s.in_flight.push_back({off, std::move(s.uncommitted[tid()])});
  s.uncommitted[tid()].clear();
  s.stalled = 0;
}

// PTX mbarrier.test_wait/try_wait (.parity variant): true once the phase with parity `parity` has completed, i.e. the
// current (incomplete) phase has the other parity. A waiting thread yields to the block's other threads.
// The MMAs a commit tracks complete as late as allowed: only when a waiter would otherwise block (so a wait that
// returns early, on a phase that completed before, leaves them in flight). A block whose waiters all poll for 1000
// scheduling rounds without any mbarrier or tcgen05 progress is deadlocked.
inline void wait_parity(const uint64_t* bar, int parity) {
  if (skip_mbarrier_wait) return;
  if (wait_parity0) parity = 0;
  const uint32_t off = smem_offset(bar, 8, "mbarrier.try_wait");
  auto done = [&] { return ((barrier_word(off, "mbarrier.try_wait.parity") >> 40) & 1) != uint64_t(parity & 1); };
  while (!done()) {
    complete_through(off);
    if (done()) return;
    if (++state->stalled > 1000ull * emu::block_dim.x)
      fail("mbarrier.try_wait.parity(%d) at shared offset %u never completes (deadlock)", parity, off);
    swapcontext(&emu::current->ctx, &emu::scheduler);
  }
}

// PTX tcgen05.ld.sync.aligned.32x32b.x1.b32: thread i of the warp reads lane taddr.lane + i, column
// taddr.col. PTX "Access restrictions" of Tensor Memory: warp w of a warpgroup may access lanes 32(w%4)..32(w%4)+31 only.
// The register is written at tcgen05.wait::ld (PTX tcgen05.wait): until then it holds a NaN poison.
inline void tmem_load(uint32_t taddr, uint32_t& reg) {
  taddr += ld_lane_shift << 16;
  State& s = *state;
  const unsigned me = tid(), warp = me / 32;
  const uint32_t lane = taddr >> 16, col = taddr & 0xffff;
  if (lane != 32 * (warp % 4))
    fail("tcgen05.ld 32x32b: warp %u (lane quarter %u: lanes %u..%u) addressed lanes %u..%u", warp, warp % 4,
         32 * (warp % 4), 32 * (warp % 4) + 31, lane, lane + 31);
  check_columns(col, 1, "tcgen05.ld");
  if (pending_write(col))
    fail("tcgen05.ld of tensor-memory column %u while an MMA writing it has not completed (wait on its mbarrier)", col);
  s.loads[me].push_back({&reg, s.cell[lane + me % 32][col]});
  reg = kPoison;
}
inline void wait_ld() {
  if (skip_wait_ld) return;
  auto& mine = state->loads[tid()];
  for (auto& l : mine) *l.reg = l.value;
  mine.clear();
}

}  // namespace emu::sm100

// tcgen05.mma: the atoms the policies use (K-major operands; N up to 256 for the unit test's variants)
#define DCOCO_EMU_SM100_FMA(Elem, N)                                                                           \
  template <>                                                                                                  \
  inline void cute::SM100_MMA_F16BF16_SS<Elem, Elem, float, 128, N, cute::UMMA::Major::K, cute::UMMA::Major::K, \
                                         cute::UMMA::ScaleIn::One, cute::UMMA::ScaleIn::One>::fma(                \
      uint64_t const& desc_a, uint64_t const& desc_b, uint32_t const& tmem_c, uint32_t const& scaleC,          \
      uint64_t const& idescE) {                                                                                \
    if (::emu::sm100::elect_one()) ::emu::sm100::issue(desc_a, desc_b, tmem_c, scaleC, uint32_t(idescE >> 32)); \
  }
DCOCO_EMU_SM100_FMA(cute::bfloat16_t, 64)
DCOCO_EMU_SM100_FMA(cute::bfloat16_t, 128)
DCOCO_EMU_SM100_FMA(cute::bfloat16_t, 256)
DCOCO_EMU_SM100_FMA(cute::half_t, 64)
DCOCO_EMU_SM100_FMA(cute::half_t, 128)
DCOCO_EMU_SM100_FMA(cute::half_t, 256)
#undef DCOCO_EMU_SM100_FMA

namespace cute::SM100::TMEM::LOAD {
// tcgen05.ld 32x32b.x1 (more specialized than CuTe's copy_unpack for every TMEM load op; same checks, then the
// emulated load into the destination register)
template <class TS, class SLayout, class TD, class DLayout>
inline void copy_unpack(Copy_Traits<SM100_TMEM_LOAD_32dp32b1x> const&, Tensor<TS, SLayout> const& src,
                        Tensor<TD, DLayout>& dst) {
  static_assert(is_tmem<TS>::value && is_rmem<TD>::value);
  Tensor rD = recast<uint32_t>(dst);
  static_assert(decltype(size(rD))::value == 1);
  ::emu::sm100::tmem_load(raw_pointer_cast(src.data()), rD(0));
}
}  // namespace cute::SM100::TMEM::LOAD

namespace cute {
inline void emu_initialize_barrier(uint64_t& bar, int count = 1) { ::emu::sm100::mbarrier_init(&bar, count); }
inline void emu_wait_barrier(uint64_t& bar, int parity) { ::emu::sm100::wait_parity(&bar, parity); }
namespace TMEM {
class EmuAllocator1Sm {  // cute::TMEM::Allocator1Sm's interface
 public:
  static constexpr int ColumnsPerAllocationSlice = 32;
  static constexpr int Sm100TmemCapacityColumns = 512;
  void allocate(int num_columns, uint32_t* dst_ptr) {
    for (int i = 0; i <= ::emu::sm100::extra_allocations; ++i) ::emu::sm100::tmem_alloc(dst_ptr, num_columns);
  }
  void free(uint32_t tmem_ptr, int num_columns) {
    ::emu::sm100::tmem_dealloc(tmem_ptr + ::emu::sm100::dealloc_column_shift, num_columns);
  }
  void release_allocation_lock() { ::emu::sm100::tmem_relinquish(); }
};
}  // namespace TMEM
}  // namespace cute
namespace cutlass::arch {
// umma_arrive: as CUTLASS's, elect_one_sync then tcgen05.commit by the elected thread
inline void emu_umma_arrive(uint64_t const* bar) {
  if (::emu::sm100::elect_one()) ::emu::sm100::commit(bar);
}
// fence.mbarrier_init.release.cluster: orders mbarrier.init for other CTAs of the cluster (none here); the barrier's
// state is read from its shared word, so an init that has not happened is still caught.
inline void emu_fence_barrier_init() {}
inline void emu_fence_view_async_tmem_load() { ::emu::sm100::wait_ld(); }  // tcgen05.wait::ld
}  // namespace cutlass::arch

// the redirects (see the top of this file)
#define initialize_barrier emu_initialize_barrier
#define wait_barrier emu_wait_barrier
#define umma_arrive emu_umma_arrive
#define fence_barrier_init emu_fence_barrier_init
#define fence_view_async_tmem_load emu_fence_view_async_tmem_load
#define Allocator1Sm EmuAllocator1Sm
#endif  // DCOCO_EMULATE_MMA
