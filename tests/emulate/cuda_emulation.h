// Runs CUDA kernels written for dcoco on the CPU, one std::thread per CUDA thread, so the CPU tests can
// exercise the kernels' own decomposition (phases, barriers, warp reductions, the last-CTA handoff).
// Only what dcoco's kernels use is emulated. Blocks run one after another, which is one legal schedule.
#pragma once
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
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
struct Block {
  std::unique_ptr<std::barrier<>> block_barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<float> exchange;  // one slot per thread for warp shuffles
};
inline thread_local dim3 thread_idx, block_idx;
inline dim3 grid_dim, block_dim;
inline Block* block = nullptr;
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define gridDim (emu::grid_dim)
#define blockDim (emu::block_dim)

inline void __syncthreads() { emu::block->block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::block->warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  auto& ex = emu::block->exchange;
  const unsigned me = threadIdx.x, warp0 = me / 32 * 32;
  ex[me] = v;
  __syncwarp();
  const float other = ex[warp0 + ((me % 32) ^ unsigned(mask))];
  __syncwarp();
  return other;
}
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

namespace emu {
// kernel<<<grid, threads>>>(args...) as launch(grid, threads, [&] { kernel(args...); }).
inline void launch(dim3 grid, dim3 threads, const std::function<void()>& body) {
  grid_dim = grid, block_dim = threads;
  const unsigned n = threads.x;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      Block b;
      b.block_barrier = std::make_unique<std::barrier<>>(n);
      for (unsigned w = 0; w < n / 32; ++w) b.warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
      b.exchange.resize(n);
      block = &b;
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < n; ++t)
        pool.emplace_back([&, t] {
          thread_idx = dim3(t), block_idx = dim3(bx, by);
          body();
        });
      for (auto& th : pool) th.join();
    }
}
}  // namespace emu
