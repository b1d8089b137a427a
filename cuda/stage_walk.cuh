// Stages 3 and 4: the score grid (per request and transition) and the greedy walk (per request).
//   S_p(a,b) = l_{p+1}(b) + b2 + w2 . gelu(u_p + pred_p(a) + succ_{p+1}(b)),   u_p = W1_s (P_p + Q_{p+1}) + b1
#pragma once
#include "stage_fuse.cuh"

namespace dcoco::cuda {

// Waits for every stage-2 tile of request q's slots.
__device__ inline void wait_request(const ForwardParams& p, const Plan& l, int64_t q, int* counters) {
  const int64_t s0 = q * p.B;
  for (int64_t g = s0 / l.group_slots; g <= (s0 + p.B - 1) / l.group_slots; ++g)
    wait_for(counters + l.group_done + g, l.fuse_col_tiles);
}

// u (H) of the transition from slot s to s+1.
__device__ inline void pair_term(const ForwardParams& p, const Plan& l, const float* ws, int64_t s, float* u) {
  const int64_t H = p.H;
  for (int64_t h = threadIdx.x; h < H; h += kThreads)
    u[h] = ws[l.pair_parts + s * 2 * H + h] + ws[l.pair_parts + (s + 1) * 2 * H + H + h] + p.w.b1[h];
}

// The grid stage 3 writes: the wanted scores, or the workspace's copy the walk reads.
__device__ inline float* grid_of(const ForwardParams& p, const Plan& l, float* ws) {
  return p.scores ? p.scores : ws + l.walk_grid;
}

// Tile t: predecessors [a0, a0 + l.preds_per_tile) of one transition, against all K successors.
__device__ void score_tile(const ForwardParams& p, const Plan& l, int64_t t, char* smem, float* ws, int* counters) {
  const int64_t K = p.K, H = p.H, rows = l.preds_per_tile, tt = t / l.tiles_per_transition;
  const int64_t a0 = t % l.tiles_per_transition * rows, q = tt / (p.B - 1), s = transition_slot(tt, p.B);
  const int64_t n = (K - a0 < rows ? K - a0 : rows) * K;
  wait_request(p, l, q, counters);
  float* u = reinterpret_cast<float*>(smem);
  pair_term(p, l, ws, s, u);
  __syncthreads();
  float* grid = grid_of(p, l, ws) + (tt * K + a0) * K;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const int64_t a = a0 + j / K, b = j % K;
    grid[j] = transition_score(u, ws + l.pred + (s * K + a) * H, ws + l.succ + ((s + 1) * K + b) * H, p.w.w2, int(H),
                               p.w.b2[0], cand_logit(p, (s + 1) * K + b));
  }
  arrive(counters + l.grid_done + q);
}

__device__ void walk_tile(const ForwardParams& p, const Plan& l, int64_t q, char* smem, float* ws, int* counters) {
  const int64_t B = p.B, K = p.K, H = p.H, s0 = q * B;
  const int tid = threadIdx.x;
  float* u = reinterpret_cast<float*>(smem);  // (B-1,H), or the request's grid (B-1,K,K)
  float* partial = u + l.walk_buffer_floats;                  // (kThreads)
  float* row = partial + kThreads;            // (K)
  for (int64_t b = tid; b < K; b += kThreads) row[b] = cand_logit(p, s0 * K + b);
  if (l.has_grid) {  // the grid exists: walk it, from shared memory when it fits (one parallel load, then no L2 trips)
    wait_for(counters + l.grid_done + q, (B - 1) * l.tiles_per_transition);
    const float* grid = grid_of(p, l, ws) + q * (B - 1) * K * K;
    if (l.grid_in_smem) {
      for (int64_t j = tid; j < (B - 1) * K * K; j += kThreads) u[j] = grid[j];
      __syncthreads();
      grid = u;
    }
    if (tid == 0) greedy_walk(grid, row, int(B), int(K), p.ranks + s0);
  } else {  // greedy reads one predecessor row per step, each score split over the CTA, summed in order
    wait_request(p, l, q, counters);
    for (int64_t t = 0; t + 1 < B; ++t) pair_term(p, l, ws, s0 + t, u + t * H);
    __syncthreads();
    const int64_t parts = kThreads / K;  // threads per successor
    int64_t k = argmax(row, int(K));
    __syncthreads();
    if (tid == 0) p.ranks[s0] = k;
    for (int64_t t = 0; t + 1 < B; ++t) {
      const int64_t s = s0 + t;
      if (tid < K * parts) {
        const int64_t b = tid / parts, part = tid % parts;
        partial[tid] = transition_terms(u + t * H, ws + l.pred + (s * K + k) * H, ws + l.succ + ((s + 1) * K + b) * H,
                                        p.w.w2, int(part * H / parts), int((part + 1) * H / parts));
      }
      __syncthreads();
      for (int64_t b = tid; b < K; b += kThreads) {
        float sum = 0.f;
        for (int64_t part = 0; part < parts; ++part) sum += partial[b * parts + part];
        row[b] = cand_logit(p, (s + 1) * K + b) + (sum + p.w.b2[0]);
      }
      __syncthreads();
      k = argmax(row, int(K));
      __syncthreads();  // every thread has read row before the next step overwrites it
      if (tid == 0) p.ranks[s + 1] = k;
    }
  }
  __syncthreads();
  for (int64_t t = tid; t < B; t += kThreads)
    p.tokens[s0 + t] = load_id(p.cand_ids, p.ids_dtype, (s0 + t) * K + p.ranks[s0 + t]);
}

}  // namespace dcoco::cuda
