// Runs CUDA kernels written for dcoco on the CPU so the CPU tests exercise the kernels' own decomposition
// (stages, barriers, warp reductions, inter-CTA counters) and the real host launchers (cuda/*.cu, against
// cuda_runtime.h from the toolkit, its functions defined in fake_runtime.h for a fake device). Several blocks
// run at once, each on its own OS thread (so `__shared__` = thread_local static is per block); inside a block
// every CUDA thread is a coroutine (ucontext), and a barrier yields until every thread of its block (or warp,
// or warpgroup) has arrived. Spin-waits on other blocks yield the OS thread. Only what dcoco's kernels use is
// emulated; with DCOCO_EMULATE_MMA, CuTe's instruction wrappers that reach their host fallback stop the run
// (CUTE_INVALID_CONTROL_PATH) unless tensor_cores.h emulates them.
// Dynamic shared memory is the launch's size, and every byte after it (up to more than any GPU allows) is a guard
// checked after every block: a kernel that writes past what it was launched with stops the run, as the GPU would
// fault.
#pragma once
#include <cuda_runtime.h>  // the toolkit's host header: types, enums and declarations only
#include <ucontext.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static thread_local
#define DCOCO_DYNAMIC_SMEM(name) char* const name = emu::dynamic_smem.data()
#define DCOCO_LAUNCH(kernel, grid, block, smem, stream) emu::launcher(kernel, grid, block, smem)

namespace emu {
[[noreturn]] inline void unemulated(const char* what) {
  std::fprintf(stderr, "not emulated: %s\n", what);
  std::exit(7);
}
}  // namespace emu

#if defined(DCOCO_EMULATE_MMA)
#include <cute/config.hpp>
#undef CUTE_INVALID_CONTROL_PATH
#define CUTE_INVALID_CONTROL_PATH(x) ::emu::unemulated(x)
#define CUTE_CVTA_GENERIC_TO_SHARED_ACTIVATED 1  // cast_smem_ptr_to_uint: __cvta_generic_to_shared below
#endif

namespace emu {

struct Thread {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;
  dim3 idx;
  bool done = false;
};

struct Barrier {  // counts arrivals; a new generation starts when all have arrived
  unsigned size = 0, arrived = 0, generation = 0;
};

inline dim3 grid_dim, block_dim;        // the launch's, read-only while it runs
inline thread_local dim3 block_idx;      // everything below: the block this OS thread runs
inline thread_local Thread* current = nullptr;
inline thread_local ucontext_t scheduler;
inline thread_local Barrier block_barrier;
inline thread_local std::vector<Barrier> warp_barriers, warpgroup_barriers;
inline thread_local std::vector<float> exchange;  // one slot per thread for warp shuffles
constexpr size_t kSpan = 260 * 1024;              // bytes of each block's buffer: any GPU's limit, and more
constexpr unsigned char kCanary = 0xA5;
inline size_t dynamic_bytes = 0;                   // the launch's dynamic shared memory
struct alignas(1024) Chunk {
  char bytes[1024];
};
struct SharedBuffer {
  std::vector<Chunk> chunks;  // 1024-aligned, as the kernels' carve-outs assume
  char* data() { return chunks.front().bytes; }
};
inline thread_local SharedBuffer dynamic_smem;  // the block this OS thread runs

// Per-block state of an emulated instruction family (tensor memory, mbarriers, ...): reset before each block.
inline std::vector<void (*)()>& block_resets() {
  static std::vector<void (*)()> hooks;
  return hooks;
}

inline void wait(Barrier& b) {
  const unsigned gen = b.generation;
  if (++b.arrived == b.size) {
    b.arrived = 0, ++b.generation;
    return;
  }
  while (b.generation == gen) swapcontext(&current->ctx, &scheduler);
}

}  // namespace emu

#define threadIdx (emu::current->idx)
#define blockIdx (emu::block_idx)
#define gridDim (emu::grid_dim)
#define blockDim (emu::block_dim)

inline void __syncthreads() { emu::wait(emu::block_barrier); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::wait(emu::warp_barriers[threadIdx.x / 32]); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  const unsigned me = threadIdx.x, warp0 = me / 32 * 32;
  emu::exchange[me] = v;
  __syncwarp();
  const float other = emu::exchange[warp0 + ((me % 32) ^ unsigned(mask))];
  __syncwarp();
  return other;
}
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
#define DCOCO_SPIN_PAUSE() std::this_thread::yield()
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

// A shared-memory address as the instructions see it: the byte offset in the block's dynamic shared memory
// (the tensor-core operands and mbarriers live there; static __shared__ variables are not addressable).
inline size_t __cvta_generic_to_shared(const void* p) {
  const char* c = static_cast<const char*>(p);
  const char* base = emu::dynamic_smem.data();
  if (c < base || c >= base + emu::kSpan) emu::unemulated("a shared-memory address outside dynamic shared memory");
  return size_t(c - base);
}
inline void __trap() { emu::unemulated("__trap: a kernel the build did not compile for this arch"); }
inline void __syncwarpgroup() { emu::wait(emu::warpgroup_barriers[threadIdx.x / 128]); }

namespace emu {

inline const std::function<void()>* body = nullptr;

inline void trampoline() {
  (*body)();
  current->done = true;
  swapcontext(&current->ctx, &scheduler);
}

// One block: its CUDA threads round-robin until every one has returned; a thread that returns early
// leaves the block barrier, as on the GPU where exited threads no longer count.
inline void run_block(dim3 idx, std::vector<Thread>& pool) {
  const unsigned n = block_dim.x;
  block_idx = idx;
  block_barrier = {n, 0, 0};
  warp_barriers.assign((n + 31) / 32, Barrier{32, 0, 0});
  warpgroup_barriers.assign((n + 127) / 128, Barrier{128, 0, 0});
  exchange.assign(n, 0.f);
  for (auto reset : block_resets()) reset();
  for (unsigned i = 0; i < n; ++i) {
    Thread& t = pool[i];
    t.idx = dim3(i), t.done = false;
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = t.stack.get(), t.ctx.uc_stack.ss_size = 256 * 1024, t.ctx.uc_link = nullptr;
    makecontext(&t.ctx, trampoline, 0);
  }
  char* guard = dynamic_smem.data() + dynamic_bytes;  // every byte past the launch's size, up to kSpan
  const size_t guarded = kSpan - dynamic_bytes;
  std::memset(guard, kCanary, guarded);
  for (unsigned live = n; live;) {
    live = 0;
    for (auto& t : pool) {
      if (t.done) continue;
      current = &t;
      swapcontext(&scheduler, &t.ctx);
      live += !t.done;
    }
  }
  for (size_t i = 0; i < guarded; ++i)
    if (static_cast<unsigned char>(guard[i]) != kCanary) {
      std::fprintf(stderr, "emulated block (%u,%u) wrote shared memory byte %zu, past the %zu it was launched with\n",
                   idx.x, idx.y, dynamic_bytes + i, dynamic_bytes);
      std::exit(6);
    }
}

// kernel<<<grid, threads, smem>>>(args...) as launch(grid, threads, smem, [&] { kernel(args...); }): `workers`
// OS threads take blocks in order, so up to that many blocks are in flight at once, like CTAs on SMs.
inline void launch(dim3 grid, dim3 threads, size_t smem, const std::function<void()>& kernel, unsigned workers = 4) {
  grid_dim = grid, block_dim = threads, body = &kernel, dynamic_bytes = smem;
  std::atomic<uint64_t> next{0};
  const uint64_t blocks = uint64_t(grid.x) * grid.y;
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      if (dynamic_bytes > kSpan) std::exit(5);  // over every GPU's limit
      dynamic_smem.chunks.assign(kSpan / sizeof(Chunk), Chunk{});
      std::vector<Thread> threads_of_block(block_dim.x);
      for (auto& t : threads_of_block) t.stack.reset(new char[256 * 1024]);
      for (uint64_t b; (b = next.fetch_add(1)) < blocks;)
        run_block(dim3(unsigned(b % grid.x), unsigned(b / grid.x)), threads_of_block);
    });
  for (auto& t : pool) t.join();
}

}  // namespace emu

#include "fake_runtime.h"
