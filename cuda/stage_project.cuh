// Stage 1: one (kBM,kBN) tile over one range of d of the projections
//   slot problem      (S,3r)  = hidden (S,d) [W_ctx ; W_pair[:, :d] ; W_pair[:, d:]]^T   -> g, P, Q
//   candidate problem (C,r)   = E[cand_ids] (C,d) W_cand^T          (only without the vocabulary table)
// written as partial sums of its d range: part[split] (S,3r) or (C,r); stage 2 adds them in order.
#pragma once
#include "mainloop.cuh"

namespace dcoco::cuda {

// Candidate c's id clamped into [0, V) for memory safety, and its logit, NaN when the id is out of range
// so that it is never selected (ids are not checked on the host: that would sync).
template <class Params>  // ForwardParams or GradParams<float>
__device__ inline int64_t cand_id(const Params& p, int64_t c) {
  const int64_t id = load_id(p.cand_ids, p.ids_dtype, c);
  return id < 0 || id >= p.V ? 0 : id;
}

__device__ inline float cand_logit(const ForwardParams& p, int64_t c) {
  const int64_t id = load_id(p.cand_ids, p.ids_dtype, c);
  return id < 0 || id >= p.V ? __int_as_float(0x7fc00000) : load_float(p.cand_logits, p.logits_dtype, c);
}

// Which stage-1 tile ticket t is.
struct ProjectTile {
  bool slots;                     // slot problem, else candidate problem
  int64_t m, n, split;            // tile coordinates
  int64_t M, N;                   // problem shape (rows, columns)
};

__device__ inline ProjectTile project_tile_of(const ForwardParams& p, const Plan& l, int64_t t) {
  ProjectTile x{};
  const int64_t slot_tiles = l.slot_row_tiles * l.slot_col_tiles * l.k_splits;
  x.slots = t < slot_tiles;
  if (!x.slots) t -= slot_tiles;
  const int64_t nt = x.slots ? l.slot_col_tiles : l.cand_col_tiles;
  x.split = t % l.k_splits, x.n = t / l.k_splits % nt, x.m = t / l.k_splits / nt;
  x.M = x.slots ? l.S : l.C, x.N = x.slots ? 3 * p.r : p.r;
  return x;
}

template <class Mma>
__device__ void project(const ForwardParams& p, const Plan& l, const ProjectTile& x, char* smem, float* ws,
                        int* counters) {
  const int64_t d = p.d, r = p.r, row0 = x.m * kBM, col0 = x.n * kBN;
  // element offsets of the tile's A rows and float pointers of its B rows, looked up once
  auto* a_row = reinterpret_cast<int64_t*>(smem);
  auto* b_row = reinterpret_cast<const float**>(smem + kBM * 8);
  auto& st = *reinterpret_cast<typename Mma::Storage*>(smem + align_up((kBM + kBN) * 8));
  for (int i = threadIdx.x; i < kBM; i += kThreads) {
    const int64_t row = row0 + i;
    a_row[i] = row >= x.M ? -1 : (x.slots ? row : cand_id(p, row)) * d;
  }
  for (int i = threadIdx.x; i < kBN; i += kThreads) {
    const int64_t col = col0 + i;
    const float* w = nullptr;
    if (col < x.N)
      w = !x.slots ? p.w.cand_proj + col * d
                   : col < r ? p.w.ctx_proj + col * d : p.w.pair_proj + (col % r) * 2 * d + (col < 2 * r ? 0 : d);
    b_row[i] = w;
  }
  __syncthreads();
  const void* a = x.slots ? p.hidden : p.embed;
  const DType at = x.slots ? p.hidden_dtype : p.embed_dtype;
  auto la = [&](int m, int64_t k) { return a_row[m] < 0 ? 0.f : load_float(a, at, a_row[m] + k); };
  auto lb = [&](int n, int64_t k) { return b_row[n] ? ldg(b_row[n] + k) : 0.f; };
  typename Mma::Acc acc;
  const int64_t span = l.split_kblocks * kBK, k0 = x.split * span, k1 = k0 + span < d ? k0 + span : d;
  tile_gemm<Mma>(st, acc, la, lb, k0, k1);
  float* part = ws + (x.slots ? l.slot_partials : l.cand_partials) + x.split * x.M * x.N;
  Mma::store(acc, [&](int m, int n, float v) {
    if (row0 + m < x.M && col0 + n < x.N) part[(row0 + m) * x.N + col0 + n] = v;
  });
  Mma::end(st, acc);
  arrive(counters + (x.slots ? l.slot_done : l.cand_done) + x.m);
}

}  // namespace dcoco::cuda
