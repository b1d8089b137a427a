// The portable fused forward (SIMT; any GPU the build targets), one launch for the whole batch.
//
// Grid (kGroups, R), kThreads per CTA. Phase 1 spreads request q's d-wide dot products over its kGroups
// CTAs, a warp per dot (coalesced along d, butterfly-reduced, so deterministic):
//   [g | P | Q] (B, 3r) = hidden_q [W_ctx ; W_pair[:, :d] ; W_pair[:, d:]]^T
//   W_cand E[c] (B K, r) for the candidates, unless the vocabulary table is given.
// Each CTA then arrives on counters[q]; the last one to arrive (release/acquire through __threadfence)
// runs phase 2 for request q alone: the LayerNorms and fusion, the rank-split MLP terms, the score grid
// and/or the greedy walk, all through the shared arithmetic of dcoco/math.h. No CTA ever waits on
// another, so any grid size is safe, and the result does not depend on which CTA arrives last.
#pragma once
#include "dcoco/math.h"
#include "dcoco/params.h"

namespace dcoco::cuda {

constexpr int kThreads = 256;
constexpr int kGroups = 16;  // CTAs sharing one request's 3 MB of d-wide weights in phase 1

// One request's slice of the workspace, in floats.
struct Slab {
  float *gpq, *cand, *gf, *z, *succ, *pair, *pred, *arow, *row;
};

__host__ __device__ inline int64_t slab_floats(const CorrectParams& p) {
  const int64_t B = p.B, BK = p.B * p.K, r = p.r, H = p.H;
  return B * 3 * r + (p.table ? 0 : BK * r) + B * r + BK * r + BK * H + (B - 1) * H + (p.scores ? BK * H : 0) + H +
         p.K;
}

__device__ inline Slab slab_of(const CorrectParams& p, int64_t q) {
  const int64_t B = p.B, BK = p.B * p.K, r = p.r, H = p.H;
  Slab s;
  s.gpq = p.workspace + q * slab_floats(p);     // (B, 3r)
  s.cand = s.gpq + B * 3 * r;                   // (BK, r) W_cand E[c], no-table path only
  s.gf = s.cand + (p.table ? 0 : BK * r);       // (B, r)
  s.z = s.gf + B * r;                           // (BK, r)
  s.succ = s.z + BK * r;                        // (BK, H)
  s.pair = s.succ + BK * H;                     // (B-1, H)
  s.pred = s.pair + (B - 1) * H;                // (BK, H), score grid only
  s.arow = s.pred + (p.scores ? BK * H : 0);    // (H) the walk's predecessor terms
  s.row = s.arow + H;                           // (K) the walk's scores
  return s;
}

// sum_k x[k] w[k] over one warp, x of any float dtype at element offset xo; every lane gets the sum.
__device__ inline float warp_dot(const void* x, DType t, int64_t xo, const float* w, int64_t n) {
  float s = 0.f;
  for (int64_t k = threadIdx.x % 32; k < n; k += 32) s += load_float(x, t, xo + k) * w[k];
  for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

__device__ inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Candidate c of request q: its id clamped into [0, V) for memory safety, and its logit, NaN when the id
// was out of range so that it is never selected (ids are not checked on the host: no sync).
__device__ inline int64_t cand_id(const CorrectParams& p, int64_t q, int64_t c) {
  const int64_t id = load_id(p.cand_ids, p.ids_dtype, q * p.B * p.K + c);
  return id < 0 || id >= p.V ? 0 : id;
}

__device__ inline float cand_logit(const CorrectParams& p, int64_t q, int64_t c) {
  const int64_t id = load_id(p.cand_ids, p.ids_dtype, q * p.B * p.K + c);
  const float l = load_float(p.cand_logits, p.logits_dtype, q * p.B * p.K + c);
  return id < 0 || id >= p.V ? __int_as_float(0x7fc00000) : l;
}

__device__ void phase1(const CorrectParams& p, const Slab& s, int64_t q) {
  const int64_t B = p.B, d = p.d, r = p.r, n_slot = B * 3 * r, n_cand = p.table ? 0 : B * p.K * r;
  const int warps = kThreads / 32, warp = threadIdx.x / 32;
  for (int64_t j = int64_t(blockIdx.x) * warps + warp; j < n_slot + n_cand; j += int64_t(gridDim.x) * warps) {
    float v;
    if (j < n_slot) {
      const int64_t slot = j / (3 * r), o = j % (3 * r);
      const float* w = o < r ? p.w.ctx_proj + o * d : p.w.pair_proj + (o % r) * 2 * d + (o < 2 * r ? 0 : d);
      v = warp_dot(p.hidden, p.hidden_dtype, (q * B + slot) * d, w, d);
    } else {
      const int64_t c = (j - n_slot) / r, o = (j - n_slot) % r;
      v = warp_dot(p.embed, p.embed_dtype, cand_id(p, q, c) * d, p.w.cand_proj + o * d, d);
    }
    if (threadIdx.x % 32 == 0) (j < n_slot ? s.gpq : s.cand - n_slot)[j] = v;
  }
}

__device__ void phase2(const CorrectParams& p, const Slab& s, int64_t q) {
  const int64_t B = p.B, K = p.K, BK = B * K, r = p.r, H = p.H, in = 3 * r + 2;
  const int tid = threadIdx.x;
  const Weights& w = p.w;
  // g = LN(W_ctx h) in place, gf = W_fuse[:, r:] g   (B, r)
  for (int64_t slot = tid; slot < B; slot += kThreads) layer_norm(s.gpq + slot * 3 * r, int(r), nullptr, nullptr);
  if (!p.table)
    for (int64_t c = tid; c < BK; c += kThreads) layer_norm(s.cand + c * r, int(r), nullptr, nullptr);
  __syncthreads();
  for (int64_t j = tid; j < B * r; j += kThreads)
    s.gf[j] = dot(w.fuse_proj + (j % r) * 2 * r + r, s.gpq + (j / r) * 3 * r, r);
  __syncthreads();
  // z = LN_gb(W_fuse [b ; g])   (BK, r), b from the table or from W_fuse[:, :r] LN(W_cand E[c])
  for (int64_t j = tid; j < BK * r; j += kThreads) {
    const int64_t c = j / r, o = j % r;
    const float b = p.table ? p.table[cand_id(p, q, c) * r + o] : dot(w.fuse_proj + o * 2 * r, s.cand + c * r, r);
    s.z[j] = b + s.gf[(c / K) * r + o];
  }
  __syncthreads();
  for (int64_t c = tid; c < BK; c += kThreads) layer_norm(s.z + c * r, int(r), w.fuse_gamma, w.fuse_beta);
  __syncthreads();
  // successor (and, for the grid, predecessor) terms (BK, H); pair terms (B-1, H)
  for (int64_t j = tid; j < BK * H; j += kThreads) {
    const int64_t c = j / H, h = j % H;
    const float l = cand_logit(p, q, c);
    s.succ[j] = dot(w.w1 + h * in + 2 * r, s.z + c * r, r) + w.w1[h * in + 3 * r + 1] * l;
    if (p.scores) s.pred[j] = dot(w.w1 + h * in + r, s.z + c * r, r) + w.w1[h * in + 3 * r] * l;
  }
  for (int64_t j = tid; j < (B - 1) * H; j += kThreads) {
    const int64_t t = j / H, h = j % H;
    const float* P = s.gpq + t * 3 * r + r;
    const float* Q = s.gpq + (t + 1) * 3 * r + 2 * r;
    float acc = 0.f;
    for (int64_t i = 0; i < r; ++i) acc += w.w1[h * in + i] * (P[i] + Q[i]);
    s.pair[j] = acc + w.b1[h];
  }
  __syncthreads();
  // the score grid (B-1, K, K)
  if (p.scores) {
    for (int64_t j = tid; j < (B - 1) * K * K; j += kThreads) {
      const int64_t t = j / (K * K), a = j / K % K, b = j % K;
      p.scores[q * (B - 1) * K * K + j] = transition_score(s.pair + t * H, s.pred + (t * K + a) * H,
                                                           s.succ + ((t + 1) * K + b) * H, w.w2, int(H), w.b2[0],
                                                           cand_logit(p, q, (t + 1) * K + b));
    }
    __syncthreads();
  }
  if (!p.ranks) return;
  // the greedy walk: slot 1's argmax, then the best successor of the chosen predecessor, slot by slot
  float* first = s.row;
  for (int64_t b = tid; b < K; b += kThreads) first[b] = cand_logit(p, q, b);
  __syncthreads();
  int64_t k = argmax(first, int(K));
  __syncthreads();
  if (tid == 0) p.ranks[q * B] = k;
  for (int64_t t = 0; t + 1 < B; ++t) {
    const float* row = s.row;
    if (p.scores) {
      row = p.scores + (q * (B - 1) + t) * K * K + k * K;
    } else {
      const int64_t c = t * K + k;
      for (int64_t h = tid; h < H; h += kThreads)
        s.arow[h] = dot(w.w1 + h * in + r, s.z + c * r, r) + w.w1[h * in + 3 * r] * cand_logit(p, q, c);
      __syncthreads();
      for (int64_t b = tid; b < K; b += kThreads)
        s.row[b] = transition_score(s.pair + t * H, s.arow, s.succ + ((t + 1) * K + b) * H, w.w2, int(H), w.b2[0],
                                    cand_logit(p, q, (t + 1) * K + b));
      __syncthreads();
    }
    k = argmax(row, int(K));
    __syncthreads();  // every thread has read row before the next step overwrites it
    if (tid == 0) p.ranks[q * B + t + 1] = k;
  }
  __syncthreads();
  for (int64_t t = tid; t < B; t += kThreads)
    p.tokens[q * B + t] = load_id(p.cand_ids, p.ids_dtype, (q * B + t) * K + p.ranks[q * B + t]);
}

__global__ void __launch_bounds__(kThreads) correct_kernel(CorrectParams p) {
  const int64_t q = blockIdx.y;
  const Slab s = slab_of(p, q);
  phase1(p, s, q);
  __shared__ bool last;
  __threadfence();  // release: this thread's phase-1 results are visible GPU-wide before the arrival
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(p.counters + q, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // acquire the other CTAs' results
  phase2(p, s, q);
}

}  // namespace dcoco::cuda
