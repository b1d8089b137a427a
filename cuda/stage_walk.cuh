// Stages 3 and 4: the score grid (per request and transition) and the greedy walk (per request).
//   S_p(a,b) = l_{p+1}(b) + b2 + w2 . gelu(u_p + pred_p(a) + succ_{p+1}(b)),   u_p = W1_s (P_p + Q_{p+1}) + b1
#pragma once
#include "stage_fuse.cuh"

namespace dcoco::cuda {

// Waits for every stage-2 tile of request q's slots.
__device__ inline void wait_request(const CorrectParams& p, const Plan& l, int64_t q, int* counters) {
  const int64_t s0 = q * p.B;
  for (int64_t g = s0 / l.G; g <= (s0 + p.B - 1) / l.G; ++g) wait_for(counters + l.group_done + g, l.g_nt);
}

// u (H) of the transition from slot s to s+1.
__device__ inline void pair_term(const CorrectParams& p, const Plan& l, const float* ws, int64_t s, float* u) {
  const int64_t H = p.H;
  for (int64_t h = threadIdx.x; h < H; h += kThreads)
    u[h] = ws[l.pq + s * 2 * H + h] + ws[l.pq + (s + 1) * 2 * H + H + h] + p.w.b1[h];
}

__device__ void score_tile(const CorrectParams& p, const Plan& l, int64_t t, char* smem, float* ws, int* counters) {
  const int64_t K = p.K, H = p.H, q = t / (p.B - 1), s = transition_slot(t, p.B);
  wait_request(p, l, q, counters);
  float* u = reinterpret_cast<float*>(smem);
  pair_term(p, l, ws, s, u);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < K * K; j += kThreads) {
    const int64_t a = j / K, b = j % K;
    p.scores[t * K * K + j] = transition_score(u, ws + l.pred + (s * K + a) * H, ws + l.succ + ((s + 1) * K + b) * H,
                                               p.w.w2, int(H), p.w.b2[0], cand_logit(p, (s + 1) * K + b));
  }
  arrive(counters + l.grid_done + q);
}

__device__ void walk_tile(const CorrectParams& p, const Plan& l, int64_t q, char* smem, float* ws, int* counters) {
  const int64_t B = p.B, K = p.K, H = p.H, s0 = q * B;
  const int tid = threadIdx.x;
  float* u = reinterpret_cast<float*>(smem);  // (B-1,H)
  float* partial = u + (B - 1) * H;           // (kThreads)
  float* row = partial + kThreads;            // (K)
  for (int64_t b = tid; b < K; b += kThreads) row[b] = cand_logit(p, s0 * K + b);
  if (p.scores) {  // the grid exists: walk it
    wait_for(counters + l.grid_done + q, B - 1);
    if (tid == 0) greedy_walk(p.scores + q * (B - 1) * K * K, row, int(B), int(K), p.ranks + s0);
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
