// Runs CUDA kernels written for dcoco on the CPU so the CPU tests exercise the kernels' own decomposition
// (phases, barriers, warp reductions, the last-CTA handoff). Each CUDA thread is a coroutine (ucontext)
// on one OS thread; a barrier yields until every thread of its block (or warp) has arrived. Only what
// dcoco's kernels use is emulated. Blocks run one after another, which is one legal CUDA schedule.
#pragma once
#include <ucontext.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

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

inline dim3 grid_dim, block_dim, block_idx;
inline Thread* current = nullptr;
inline ucontext_t scheduler;
inline Barrier block_barrier;
inline std::vector<Barrier> warp_barriers;
inline std::vector<float> exchange;  // one slot per thread for warp shuffles

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
// Blocks run in ticket order here, so a tile never finds its inputs missing; if one does, the kernel's
// dependencies are wrong: stop instead of spinning forever.
#define DCOCO_SPIN_PAUSE() (std::fputs("emulated kernel waits on a tile that never ran\n", stderr), std::abort())
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

namespace emu {

inline const std::function<void()>* body = nullptr;

inline void trampoline() {
  (*body)();
  current->done = true;
  swapcontext(&current->ctx, &scheduler);
}

// kernel<<<grid, threads>>>(args...) as launch(grid, threads, [&] { kernel(args...); }).
inline void launch(dim3 grid, dim3 threads, const std::function<void()>& kernel) {
  constexpr size_t kStack = 256 * 1024;
  grid_dim = grid, block_dim = threads, body = &kernel;
  const unsigned n = threads.x;
  std::vector<Thread> pool(n);
  for (auto& t : pool) t.stack.reset(new char[kStack]);
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      block_idx = dim3(bx, by);
      block_barrier = {n, 0, 0};
      warp_barriers.assign((n + 31) / 32, Barrier{32, 0, 0});
      exchange.assign(n, 0.f);
      for (unsigned i = 0; i < n; ++i) {
        Thread& t = pool[i];
        t.idx = dim3(i), t.done = false;
        getcontext(&t.ctx);
        t.ctx.uc_stack.ss_sp = t.stack.get(), t.ctx.uc_stack.ss_size = kStack, t.ctx.uc_link = nullptr;
        makecontext(&t.ctx, trampoline, 0);
      }
      // Round-robin until every thread has returned; a thread that returns early (e.g. not the last CTA)
      // leaves the block barrier, as on the GPU where exited threads no longer count.
      for (unsigned live = n; live;) {
        live = 0;
        for (auto& t : pool) {
          if (t.done) continue;
          current = &t;
          swapcontext(&scheduler, &t.ctx);
          live += !t.done;
        }
      }
    }
}

}  // namespace emu
