// The portable fused forward (SIMT; any GPU the build targets): the whole batch in one launch.
//
// Each CTA takes a ticket (atomicAdd at start, not blockIdx) that picks one tile of three stages:
//   1. (16 rows x 32 columns) tiles of [g | P | Q] (S, 3r) = hidden [W_ctx ; W_pair[:, :d] ; W_pair[:, d:]]^T
//      over all S = R B slots, and, without the vocabulary table, of W_cand E[c] (C, r) over all
//      C = S K candidates; a warp per dot product (coalesced along d, butterfly-reduced: deterministic).
//   2. one tile per slot: LayerNorms and fusion (z), successor and predecessor terms of its K
//      candidates (K, H) each, and the slot's two halves of the pair term W1_s P_s, W1_s Q_s (H) each.
//   3. one tile per request: the score grid and/or the greedy walk, each walk step's K scores split
//      over the CTA and summed in a fixed order.
// A tile waits (spins) only on counters of tiles with lower tickets, which have started before it and
// never wait on it, so any grid is deadlock-free (the argument of decoupled look-back); the work of a
// tile does not depend on which CTA runs it, so results are deterministic. All arithmetic is the shared
// code of dcoco/math.h.
#pragma once
#include "dcoco/math.h"
#include "dcoco/params.h"

#ifndef DCOCO_SPIN_PAUSE
#define DCOCO_SPIN_PAUSE() __nanosleep(64)
#endif

namespace dcoco::cuda {

constexpr int kThreads = 256;
constexpr int kTileRows = 16;
constexpr int kTileCols = 32;

// One launch's tiles and workspace layout; host (sizes) and device (offsets) compute it alike.
struct Plan {
  int64_t S, C;                                           // slots R B, candidates R B K
  int64_t slot_mtiles, slot_ntiles, cand_mtiles, cand_ntiles;
  int64_t stage1, stage2, stage3;                         // tiles per stage (stage 2: S, stage 3: R)
  int64_t gpq, cand, gf, z, succ, pred, pq, u, floats;    // float offsets: (S,3r) (C,r) (S,r) (C,r) (C,H) (C,H) (S,2H) (R(B-1),H)
  int64_t ticket, slot_done, cand_done, req_done, ints;   // int32 counter offsets (zeroed before the launch)
};

__host__ __device__ inline Plan plan_of(const CorrectParams& p) {
  Plan l{};
  const int64_t r = p.r, H = p.H;
  l.S = p.R * p.B, l.C = l.S * p.K;
  l.slot_mtiles = (l.S + kTileRows - 1) / kTileRows, l.slot_ntiles = (3 * r + kTileCols - 1) / kTileCols;
  l.cand_mtiles = p.table ? 0 : (l.C + kTileRows - 1) / kTileRows;
  l.cand_ntiles = (r + kTileCols - 1) / kTileCols;
  l.stage1 = l.slot_mtiles * l.slot_ntiles + l.cand_mtiles * l.cand_ntiles, l.stage2 = l.S, l.stage3 = p.R;
  l.gpq = 0, l.cand = l.gpq + l.S * 3 * r, l.gf = l.cand + (p.table ? 0 : l.C * r), l.z = l.gf + l.S * r;
  l.succ = l.z + l.C * r, l.pred = l.succ + l.C * H, l.pq = l.pred + l.C * H, l.u = l.pq + l.S * 2 * H;
  l.floats = l.u + p.R * (p.B - 1) * H;
  l.ticket = 0, l.slot_done = 1, l.cand_done = l.slot_done + l.slot_mtiles, l.req_done = l.cand_done + l.cand_mtiles;
  l.ints = l.req_done + p.R;
  return l;
}

// sum_k x[k] w[k] over one warp, x of any float dtype from element xo; every lane gets the sum.
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

// Candidate c (global index): its id clamped into [0, V) for memory safety, and its logit, NaN when the id
// was out of range so that it is never selected (ids are not checked on the host: that would sync).
__device__ inline int64_t cand_id(const CorrectParams& p, int64_t c) {
  const int64_t id = load_id(p.cand_ids, p.ids_dtype, c);
  return id < 0 || id >= p.V ? 0 : id;
}

__device__ inline float cand_logit(const CorrectParams& p, int64_t c) {
  const int64_t id = load_id(p.cand_ids, p.ids_dtype, c);
  return id < 0 || id >= p.V ? __int_as_float(0x7fc00000) : load_float(p.cand_logits, p.logits_dtype, c);
}

// Publishes this CTA's writes, then counts one arrival.
__device__ inline void arrive(int* counter) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(counter, 1);
}

// Waits until counter reaches target (tiles with lower tickets), then reads their writes.
__device__ inline void wait_for(int* counter, int target) {
  if (threadIdx.x == 0)
    while (atomicAdd(counter, 0) < target) DCOCO_SPIN_PAUSE();
  __syncthreads();
  __threadfence();
}

__device__ void stage1(const CorrectParams& p, const Plan& l, int64_t t, float* ws, int* counters) {
  const int64_t d = p.d, r = p.r;
  const bool slots = t < l.slot_mtiles * l.slot_ntiles;
  const int64_t tile = slots ? t : t - l.slot_mtiles * l.slot_ntiles, ntiles = slots ? l.slot_ntiles : l.cand_ntiles;
  const int64_t mt = tile / ntiles, row0 = mt * kTileRows, col0 = tile % ntiles * kTileCols;
  const int64_t rows = slots ? l.S : l.C, cols = slots ? 3 * r : r;
  const int64_t m = rows - row0 < kTileRows ? rows - row0 : kTileRows, n = cols - col0 < kTileCols ? cols - col0 : kTileCols;
  for (int64_t j = threadIdx.x / 32; j < m * n; j += kThreads / 32) {
    const int64_t row = row0 + j / n, col = col0 + j % n;
    float v;
    if (slots) {
      const float* w = col < r ? p.w.ctx_proj + col * d : p.w.pair_proj + (col % r) * 2 * d + (col < 2 * r ? 0 : d);
      v = warp_dot(p.hidden, p.hidden_dtype, row * d, w, d);
    } else {
      v = warp_dot(p.embed, p.embed_dtype, cand_id(p, row) * d, p.w.cand_proj + col * d, d);
    }
    if (threadIdx.x % 32 == 0) ws[(slots ? l.gpq + row * 3 * r : l.cand + row * r) + col] = v;
  }
  arrive(counters + (slots ? l.slot_done : l.cand_done) + mt);
}

__device__ void stage2(const CorrectParams& p, const Plan& l, int64_t s, float* ws, int* counters) {
  const int64_t K = p.K, r = p.r, H = p.H, in = 3 * r + 2, c0 = s * K;
  const int tid = threadIdx.x;
  const Weights& w = p.w;
  wait_for(counters + l.slot_done + s / kTileRows, int(l.slot_ntiles));
  if (!p.table)
    for (int64_t mt = c0 / kTileRows; mt <= (c0 + K - 1) / kTileRows; ++mt)
      wait_for(counters + l.cand_done + mt, int(l.cand_ntiles));
  float* g = ws + l.gpq + s * 3 * r;  // then P = g + r, Q = g + 2r
  float* gf = ws + l.gf + s * r;
  float* cand = ws + l.cand + c0 * r;
  float* z = ws + l.z + c0 * r;
  if (tid == 0) layer_norm(g, int(r), nullptr, nullptr);
  if (!p.table)
    for (int64_t c = tid; c < K; c += kThreads) layer_norm(cand + c * r, int(r), nullptr, nullptr);
  __syncthreads();
  for (int64_t o = tid; o < r; o += kThreads) gf[o] = dot(w.fuse_proj + o * 2 * r + r, g, r);
  __syncthreads();
  for (int64_t j = tid; j < K * r; j += kThreads) {
    const int64_t c = j / r, o = j % r;
    const float b = p.table ? p.table[cand_id(p, c0 + c) * r + o] : dot(w.fuse_proj + o * 2 * r, cand + c * r, r);
    z[j] = b + gf[o];
  }
  __syncthreads();
  for (int64_t c = tid; c < K; c += kThreads) layer_norm(z + c * r, int(r), w.fuse_gamma, w.fuse_beta);
  __syncthreads();
  for (int64_t j = tid; j < K * H; j += kThreads) {
    const int64_t c = j / H, h = j % H;
    const float lg = cand_logit(p, c0 + c);
    ws[l.succ + (c0 + c) * H + h] = dot(w.w1 + h * in + 2 * r, z + c * r, r) + w.w1[h * in + 3 * r + 1] * lg;
    ws[l.pred + (c0 + c) * H + h] = dot(w.w1 + h * in + r, z + c * r, r) + w.w1[h * in + 3 * r] * lg;
  }
  for (int64_t h = tid; h < H; h += kThreads) {
    ws[l.pq + s * 2 * H + h] = dot(w.w1 + h * in, g + r, r);          // W1_s P_s
    ws[l.pq + s * 2 * H + H + h] = dot(w.w1 + h * in, g + 2 * r, r);  // W1_s Q_s
  }
  arrive(counters + l.req_done + s / p.B);
}

__device__ void stage3(const CorrectParams& p, const Plan& l, int64_t q, float* ws, int* counters) {
  const int64_t B = p.B, K = p.K, H = p.H, s0 = q * B;
  const int tid = threadIdx.x;
  wait_for(counters + l.req_done + q, int(B));
  float* u = ws + l.u + q * (B - 1) * H;  // (B-1, H): W1_s (P_t + Q_{t+1}) + b1
  for (int64_t j = tid; j < (B - 1) * H; j += kThreads) {
    const int64_t t = j / H, h = j % H;
    u[j] = ws[l.pq + (s0 + t) * 2 * H + h] + ws[l.pq + (s0 + t + 1) * 2 * H + H + h] + p.w.b1[h];
  }
  __syncthreads();
  auto pred = [&](int64_t t, int64_t a) { return ws + l.pred + ((s0 + t) * K + a) * H; };
  auto succ = [&](int64_t t, int64_t b) { return ws + l.succ + ((s0 + t) * K + b) * H; };
  if (p.scores) {
    for (int64_t j = tid; j < (B - 1) * K * K; j += kThreads) {
      const int64_t t = j / (K * K), a = j / K % K, b = j % K;
      p.scores[q * (B - 1) * K * K + j] = transition_score(u + t * H, pred(t, a), succ(t + 1, b), p.w.w2, int(H),
                                                           p.w.b2[0], cand_logit(p, (s0 + t + 1) * K + b));
    }
    __syncthreads();
  }
  if (!p.ranks) return;
  __shared__ float partial[kThreads];
  __shared__ float row[kMaxCandidates];
  const int64_t parts = kThreads / K;  // threads per successor in a walk step
  for (int64_t b = tid; b < K; b += kThreads) row[b] = cand_logit(p, s0 * K + b);
  __syncthreads();
  int64_t k = argmax(row, int(K));
  __syncthreads();
  if (tid == 0) p.ranks[s0] = k;
  for (int64_t t = 0; t + 1 < B; ++t) {
    const float* scores = row;
    if (p.scores) {
      scores = p.scores + (q * (B - 1) + t) * K * K + k * K;
    } else {  // greedy reads one predecessor row only
      if (tid < K * parts) {
        const int64_t b = tid / parts, part = tid % parts;
        partial[tid] = transition_terms(u + t * H, pred(t, k), succ(t + 1, b), p.w.w2, int(part * H / parts),
                                        int((part + 1) * H / parts));
      }
      __syncthreads();
      for (int64_t b = tid; b < K; b += kThreads) {
        float sum = 0.f;
        for (int64_t part = 0; part < parts; ++part) sum += partial[b * parts + part];
        row[b] = cand_logit(p, (s0 + t + 1) * K + b) + (sum + p.w.b2[0]);
      }
      __syncthreads();
    }
    k = argmax(scores, int(K));
    __syncthreads();  // every thread has read row before the next step overwrites it
    if (tid == 0) p.ranks[s0 + t + 1] = k;
  }
  __syncthreads();
  for (int64_t t = tid; t < B; t += kThreads)
    p.tokens[s0 + t] = load_id(p.cand_ids, p.ids_dtype, (s0 + t) * K + p.ranks[s0 + t]);
}

// Grid: plan.stage1 + plan.stage2 + plan.stage3 CTAs of kThreads; counters zeroed before the launch.
__global__ void __launch_bounds__(kThreads) correct_kernel(CorrectParams p) {
  const Plan l = plan_of(p);
  int* counters = p.counters;
  __shared__ int64_t ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(counters + l.ticket, 1);
  __syncthreads();
  const int64_t t = ticket;
  if (t < l.stage1)
    stage1(p, l, t, p.workspace, counters);
  else if (t < l.stage1 + l.stage2)
    stage2(p, l, t - l.stage1, p.workspace, counters);
  else
    stage3(p, l, t - l.stage1 - l.stage2, p.workspace, counters);
}

}  // namespace dcoco::cuda
