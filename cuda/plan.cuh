// The fused forward's schedule: which tiles one launch runs, the workspace they share and the counters
// they synchronise on. Host (sizes) and device (offsets) compute it alike from the params.
//
// Stages, in ticket order (a CTA takes the next ticket with atomicAdd, not blockIdx):
//   1. project: (kBM,kBN) tiles of [g | P | Q] (S,3r) = hidden (S,d) [W_ctx ; W_pair_L ; W_pair_R]^T and,
//      without the vocabulary table, of W_cand E[c] (C,r); d is split over `ksplit` ranges so that small
//      batches still spread their weights over the whole GPU. Each range writes its own partial sums.
//   2. fuse: per group of G slots (G K <= kBM candidate rows) and per kBN columns of [pred | succ] (C,2H):
//      reduce the partials in a fixed order, LayerNorms and fusion (z), then z W1_{a|b}^T and W1_s P|Q.
//   3. score (when the grid is wanted, or the walk reads it): per request, transition and chunk of predecessors,
//      their K successors' scores.
//   4. walk (only when ranks are wanted): per request, greedy over the finished grid (loaded into shared memory
//      when it fits), or, for more than kGridWalkRequests requests without a wanted grid, over the one row of
//      the chosen predecessor per step.
// A tile waits only on counters of tiles with lower tickets, which have started and never wait on it,
// so any grid of CTAs is deadlock-free; no result depends on which CTA ran a tile: deterministic.
#pragma once
#include "dcoco/params.h"

// Dynamic shared memory (the CPU emulation of the kernels declares a per-block buffer instead).
#ifndef DCOCO_DYNAMIC_SMEM
#define DCOCO_DYNAMIC_SMEM(name) extern __shared__ __align__(1024) char name[]
#endif

#ifndef DCOCO_SPIN_PAUSE
#define DCOCO_SPIN_PAUSE() __nanosleep(64)
#endif

namespace dcoco::cuda {

constexpr int kThreads = 256;
constexpr int kBM = 64, kBN = 128, kBK = 32;  // the GEMM tile (M,N,K) of stages 1 and 2
constexpr int64_t kMmaSmem = 40 * 1024;       // bound on any MMA policy's shared storage
constexpr int64_t kAlign = 1024;              // of shared carve-outs (swizzled wgmma operands need it)
// Up to this many requests, the walk waits for the whole grid computed across the GPU in per-predecessor tiles
// (B-1) K per request, then walks it in shared memory; above it, the serial row walk scores only the chosen
// predecessor's row, 1/K of the work, in one CTA per request. bench/walk_model.py: the grid is 3.9-5.1 us at
// R=1 against the row walk's 11.1-20.8, they cross near 6 requests, and at R=32 the row walk wins 3x.
constexpr int64_t kGridWalkRequests = 6;
constexpr int64_t kGridWalkSmem = 64 * 1024;  // a request's grid is walked from shared memory up to this size

__host__ __device__ inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ inline int64_t align_up(int64_t a) { return cdiv(a, kAlign) * kAlign; }

struct Plan {
  int64_t S, C, G;                   // slots R B, candidates R B K, slots per stage-2 group
  int64_t ksplit, kspan;             // stage 1 splits d into ksplit ranges of kspan k-blocks (kBK)
  int64_t s_mt, s_nt, c_mt, c_nt;    // stage-1 (m,n) tiles: slot problem (S,3r), candidate problem (C,r)
  int64_t groups, g_nt;              // stage-2 tiles: groups x n-tiles of (C,2H)
  int64_t stage1, stage2, stage3, stage4, ctas;
  bool grid, smem_grid;  // stage 3 runs (the grid is wanted or walked); the walk loads its grid into shared memory
  int64_t rows, chunks;  // predecessors per stage-3 tile (1 up to kGridWalkRequests requests, else K: a transition),
                         // and tiles per transition, cdiv(K, rows)
  int64_t wu;            // floats of the walk's first shared carve-out: u (B-1,H) or the request's grid
  // float offsets into the workspace
  int64_t part_s, part_c, pred, succ, pq, gridw, floats;  // (ksplit,S,3r) (ksplit,C,r) (C,H) (C,H) (S,2H),
                                                         // the walked grid (R,B-1,K,K) when scores is null
  // int32 offsets into the counters (zeroed before the launch)
  int64_t ticket, slot_done, cand_done, group_done, grid_done, ints;
  // dynamic shared memory of one CTA, in bytes (the largest stage's), and the stage-2 carve-out offsets
  int64_t fz, fc, fg, fgf, fp, fq, fmma, smem;  // z (G K,r), then c (G K,r) g gf P Q (G,r) each, MMA storage
  bool fits;                                    // smem <= the cap plan_of was given
};

// Stage 2's shared memory for groups of G slots: z (G K, r) stays live through the GEMM; c, g, gf, P and Q are
// dead by then, so the MMA storage overlays them.
__host__ __device__ inline int64_t fuse_smem(int64_t G, int64_t K, int64_t r, bool table) {
  const int64_t z = align_up(G * K * r * 4), rest = (G * K * r * !table + 4 * G * r) * 4;
  return z + align_up(rest > kMmaSmem ? rest : kMmaSmem);
}

// sms: multiprocessors of the device (0: do not split d). cap: the dynamic shared memory one CTA may have, in
// bytes (the device's opt-in maximum less the kernel's static shared memory): stage-2 groups shrink to fit it.
__host__ __device__ inline Plan plan_of(const ForwardParams& p, int sms, int64_t cap) {
  Plan l{};
  const int64_t r = p.r, H = p.H, kblocks = cdiv(p.d, kBK);
  l.S = p.R * p.B, l.C = l.S * p.K, l.G = p.K <= kBM ? kBM / p.K : 1;
  while (l.G > 1 && fuse_smem(l.G, p.K, r, p.table) > cap) --l.G;
  l.s_mt = cdiv(l.S, kBM), l.s_nt = cdiv(3 * r, kBN);
  l.c_mt = p.table ? 0 : cdiv(l.C, kBM), l.c_nt = p.table ? 0 : cdiv(r, kBN);
  // about two tiles per SM, but at least 4 k-blocks per range
  const int64_t tiles = l.s_mt * l.s_nt + l.c_mt * l.c_nt;
  int64_t want = sms > 0 ? cdiv(2 * sms, tiles) : 1, most = kblocks / 4 > 1 ? kblocks / 4 : 1;
  want = want < most ? want : most;
  l.kspan = cdiv(kblocks, want), l.ksplit = cdiv(kblocks, l.kspan);
  l.groups = cdiv(l.S, l.G), l.g_nt = cdiv(2 * H, kBN);
  l.stage1 = tiles * l.ksplit, l.stage2 = l.groups * l.g_nt;
  const int64_t grid_floats = (p.B - 1) * p.K * p.K;  // one request's grid
  l.grid = p.scores || (p.ranks && p.R <= kGridWalkRequests);
  l.rows = p.scores && p.R > kGridWalkRequests ? p.K : 1;  // a few requests: spread the grid over more CTAs
  l.chunks = cdiv(p.K, l.rows);
  l.smem_grid = l.grid && grid_floats * 4 <= kGridWalkSmem;
  l.stage3 = l.grid ? p.R * (p.B - 1) * l.chunks : 0, l.stage4 = p.ranks ? p.R : 0;
  l.ctas = l.stage1 + l.stage2 + l.stage3 + l.stage4;
  l.part_s = 0, l.part_c = l.part_s + l.ksplit * l.S * 3 * r, l.pred = l.part_c + l.ksplit * l.C * r * !p.table;
  l.succ = l.pred + l.C * H, l.pq = l.succ + l.C * H, l.gridw = l.pq + l.S * 2 * H;
  l.floats = l.gridw + (l.grid && !p.scores ? p.R * grid_floats : 0);
  l.ticket = 0, l.slot_done = 1, l.cand_done = l.slot_done + l.s_mt, l.group_done = l.cand_done + l.c_mt;
  l.grid_done = l.group_done + l.groups, l.ints = l.grid_done + p.R;
  const int64_t rows = l.G * p.K * r * 4, slots = l.G * r * 4;
  l.fz = 0, l.fc = align_up(rows), l.fg = l.fc + (p.table ? 0 : rows), l.fgf = l.fg + slots;
  l.fp = l.fgf + slots, l.fq = l.fp + slots, l.fmma = l.fc;
  const int64_t stage1 = align_up((kBM + kBN) * 8) + kMmaSmem, stage2 = fuse_smem(l.G, p.K, r, p.table);
  l.wu = l.smem_grid && grid_floats > (p.B - 1) * H ? grid_floats : (p.B - 1) * H;
  const int64_t walk = (l.wu + kThreads + 2 * kMaxCandidates) * 4;
  l.smem = stage1 > stage2 ? stage1 : stage2;
  l.smem = l.smem > walk ? l.smem : walk;
  l.fits = l.smem <= cap;
  return l;
}

// A weight element: weights are read-only for the whole launch, so the non-coherent cached path is safe.
__device__ inline float ldg(const float* x) {
#if defined(__CUDA_ARCH__)
  return __ldg(x);
#else
  return *x;
#endif
}

// sum_i w[i] x[i], w a weight row in global memory, x in shared memory.
__device__ inline float wdot(const float* w, const float* x, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s = fmaf(ldg(w + i), x[i], s);
  return s;
}

// sum_k x[k] w[k] over one warp, x of any float dtype from element xo; every lane gets the sum.
__device__ inline float warp_dot(const void* x, DType t, int64_t xo, const float* w, int64_t n) {
  float s = 0.f;
  for (int64_t k = threadIdx.x % 32; k < n; k += 32) s += load_float(x, t, xo + k) * ldg(w + k);
  for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

// Publishes this CTA's writes, then counts one arrival.
__device__ inline void arrive(int* counter) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(counter, 1);
}

// Waits until counter reaches target (tiles with lower tickets), then reads their writes.
__device__ inline void wait_for(int* counter, int64_t target) {
  if (threadIdx.x == 0)
    while (atomicAdd(counter, 0) < target) DCOCO_SPIN_PAUSE();
  __syncthreads();
  __threadfence();
}

}  // namespace dcoco::cuda
