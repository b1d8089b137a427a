// The fused forward's schedule: which tiles one launch runs, the workspace they share and the counters
// they synchronise on. Host (sizes) and device (offsets) compute it alike from the params.
//
// Stages, in ticket order (a CTA takes the next ticket with atomicAdd, not blockIdx):
//   1. project: (kBM,kBN) tiles of [g | P | Q] (S,3r) = hidden (S,d) [W_ctx ; W_pair_L ; W_pair_R]^T and,
//      without the vocabulary table, of W_cand E[c] (C,r); d is split over `k_splits` ranges so that small
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
#include "dcoco/math.h"
#include "dcoco/params.h"
#include "dcoco/walk.h"

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
  int64_t S, C;                            // slots R B, candidates R B K
  int64_t group_slots;                     // slots per stage-2 group (G)
  int64_t k_splits, split_kblocks;         // stage 1 splits d into k_splits ranges of split_kblocks k-blocks (kBK)
  int64_t slot_row_tiles, slot_col_tiles;  // stage-1 (m,n) tiles of the slot problem (S,3r)
  int64_t cand_row_tiles, cand_col_tiles;  // and of the candidate problem (C,r); none with the table
  int64_t groups, fuse_col_tiles;          // stage-2 tiles: groups x n-tiles of (C,2H)
  int64_t project_tiles, fuse_tiles, score_tiles, walk_tiles, ctas;  // per stage (1-4), and in all
  bool has_grid;      // stage 3 runs: the grid is wanted or walked
  bool grid_in_smem;  // the walk loads its request's grid into shared memory
  int64_t preds_per_tile;        // predecessors per stage-3 tile: 1 up to kGridWalkRequests requests, else K
  int64_t tiles_per_transition;  // cdiv(K, preds_per_tile)
  int64_t walk_buffer_floats;    // the walk's first shared carve-out: u (B-1,H) or the request's grid
  // float offsets into the workspace, and its size
  int64_t slot_partials, cand_partials;  // (k_splits,S,3r) (k_splits,C,r)
  int64_t pred, succ, pair_parts;        // (C,H) (C,H) (S,2H): W1_s P | W1_s Q per slot
  int64_t walk_grid;                     // (R,B-1,K,K), the grid walked when scores is null
  int64_t workspace_floats;
  // int32 offsets into the counters (zeroed before the launch), and their count
  int64_t ticket, slot_done, cand_done, group_done, grid_done, counter_ints;
  // dynamic shared memory of one CTA, in bytes (the largest stage's), and the stage-2 carve-out offsets:
  // z (G K,r), then c (G K,r), g, gf = W_fuse[:, r:] LN(g), P and Q (G,r) each, and the MMA storage over c..Q
  int64_t fuse_z, fuse_c, fuse_g, fuse_gf, fuse_p, fuse_q, fuse_mma, smem;
  bool fits;  // smem <= the cap plan_of was given
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
  l.S = p.R * p.B, l.C = l.S * p.K, l.group_slots = p.K <= kBM ? kBM / p.K : 1;
  while (l.group_slots > 1 && fuse_smem(l.group_slots, p.K, r, p.table) > cap) --l.group_slots;
  l.slot_row_tiles = cdiv(l.S, kBM), l.slot_col_tiles = cdiv(3 * r, kBN);
  l.cand_row_tiles = p.table ? 0 : cdiv(l.C, kBM), l.cand_col_tiles = p.table ? 0 : cdiv(r, kBN);
  // about two tiles per SM, but at least 4 k-blocks per range
  const int64_t tiles = l.slot_row_tiles * l.slot_col_tiles + l.cand_row_tiles * l.cand_col_tiles;
  int64_t want = sms > 0 ? cdiv(2 * sms, tiles) : 1, most = kblocks / 4 > 1 ? kblocks / 4 : 1;
  want = want < most ? want : most;
  l.split_kblocks = cdiv(kblocks, want), l.k_splits = cdiv(kblocks, l.split_kblocks);
  l.groups = cdiv(l.S, l.group_slots), l.fuse_col_tiles = cdiv(2 * H, kBN);
  l.project_tiles = tiles * l.k_splits, l.fuse_tiles = l.groups * l.fuse_col_tiles;
  const int64_t grid_floats = (p.B - 1) * p.K * p.K;  // one request's grid
  l.has_grid = p.scores || (p.ranks && p.R <= kGridWalkRequests);
  // a few requests: spread the grid over more CTAs
  l.preds_per_tile = p.scores && p.R > kGridWalkRequests ? p.K : 1;
  l.tiles_per_transition = cdiv(p.K, l.preds_per_tile);
  l.grid_in_smem = l.has_grid && grid_floats * 4 <= kGridWalkSmem;
  l.score_tiles = l.has_grid ? p.R * (p.B - 1) * l.tiles_per_transition : 0, l.walk_tiles = p.ranks ? p.R : 0;
  l.ctas = l.project_tiles + l.fuse_tiles + l.score_tiles + l.walk_tiles;
  l.slot_partials = 0, l.cand_partials = l.slot_partials + l.k_splits * l.S * 3 * r;
  l.pred = l.cand_partials + l.k_splits * l.C * r * !p.table;
  l.succ = l.pred + l.C * H, l.pair_parts = l.succ + l.C * H, l.walk_grid = l.pair_parts + l.S * 2 * H;
  l.workspace_floats = l.walk_grid + (l.has_grid && !p.scores ? p.R * grid_floats : 0);
  l.ticket = 0, l.slot_done = 1, l.cand_done = l.slot_done + l.slot_row_tiles;
  l.group_done = l.cand_done + l.cand_row_tiles, l.grid_done = l.group_done + l.groups;
  l.counter_ints = l.grid_done + p.R;
  const int64_t rows = l.group_slots * p.K * r * 4, slots = l.group_slots * r * 4;
  l.fuse_z = 0, l.fuse_c = align_up(rows), l.fuse_g = l.fuse_c + (p.table ? 0 : rows), l.fuse_gf = l.fuse_g + slots;
  l.fuse_p = l.fuse_gf + slots, l.fuse_q = l.fuse_p + slots, l.fuse_mma = l.fuse_c;
  const int64_t project_smem = align_up((kBM + kBN) * 8) + kMmaSmem;
  const int64_t fuse = fuse_smem(l.group_slots, p.K, r, p.table);
  l.walk_buffer_floats = l.grid_in_smem && grid_floats > (p.B - 1) * H ? grid_floats : (p.B - 1) * H;
  const int64_t walk = (l.walk_buffer_floats + kThreads + 2 * kMaxCandidates) * 4;
  l.smem = project_smem > fuse ? project_smem : fuse;
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
