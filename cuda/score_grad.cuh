// The backward of dcoco::score on the GPU (SIMT, float32): the forward recomputed with the intermediates the
// backward reads, then the backward, as GEMM-shaped kernels on one stream (no host sync). cuda/grad.cu launches
// them in this file's order:
//
//   forward   slot_proj   [g|P|Q] (S,3r) = hidden (S,d) [W_ctx ; W_pair_L ; W_pair_R]^T        tiles (S/kBM, 3r/kBN)
//             cand_proj   b (C,r) = E[ids] (C,d) W_cand^T                                     tiles (C/kBM, r/kBN)
//             ln_inputs   g^ = LN(g), b^ = LN(b) (a thread per row)
//             fuse        zc (C,r) = [b^ ; g^_slot] (C,2r) W_fuse^T                           tiles (C/kBM, r/kBN)
//             ln_fuse     z^ = LN(zc), z = gamma z^ + beta (a thread per row)
//             pred_succ   [pred|succ] (C,2H) = z [W1_a | W1_b]^T + [w_la | w_lb] l             tiles (C/kBM, 2H/kBN)
//             pair        u (Tn,H) = (P_p + Q_{p+1}) W1_s^T + b1                               tiles (Tn/kBM, H/kBN)
//   grid      transition  per transition: du, dpred, dsucc, the dw2 partials and the w_la/w_lb terms of d_logits
//   backward  dz          dz (C,r) = [dpred|dsucc] (C,2H) [W1_a ; W1_b]                       tiles (C/kBM, r/kBN)
//             ln_z_grad   dzc = LN'(z^) (gamma dz), d_logits (a thread per candidate)
//             db          db (C,r) = dzc W_fuse[:, :r]                                         tiles (C/kBM, r/kBN)
//             ln_b_grad   dbc = LN'(b^) db, and dzs (S,r) = sum over the slot's K of dzc
//             dg          dg (S,r) = dzs W_fuse[:, r:]                                         tiles (S/kBM, r/kBN)
//             ds          ds (Tn,r) = du (Tn,H) W1_s                                           tiles (Tn/kBM, r/kBN)
//             ln_g_grad   dgc = LN'(g^) dg (a thread per slot)
//             d_hidden    (S,d) = [dgc|dP|dQ] (S,3r) [W_ctx ; W_pair_L ; W_pair_R]             tiles (S/kBM, d/kBN)
//   weights   six GEMMs G (N,Kd) = D (M,N)^T X (M,Kd) reducing over rows M, each split into row spans (partials in
//             the workspace) and reduced in split order; six column sums (gamma, beta, b1, w2, w_la, w_lb) and b2
//             as block reductions over row chunks (partials), reduced in chunk order.
//
// Every GEMM is tile_gemm<SimtMma> (cuda/mainloop.cuh) with its own loaders and epilogue, so each weight is read
// once per row tile of the problem, never per slot or per row. No float atomics and no result depends on which
// CTA ran a tile: deterministic. The arithmetic is dcoco/math.h's (layer_norm, layer_norm_grad,
// transition_unit_grad), as on the CPU (cpp/cpu/grad.cpp has the derivation).
#pragma once
#include "stage_project.cuh"  // cand_id, tile_gemm, SimtMma, kThreads

namespace dcoco::cuda {

// The weight-gradient GEMMs split their rows until about kGradCtas CTAs run (two per SM of an H200): a constant,
// so the workspace and the summation order never depend on the device. A split spans at least kMinSpan rows.
constexpr int64_t kGradCtas = 264, kMinSpan = 256;
constexpr int64_t kColRows = 256;  // rows per chunk of a column sum
constexpr int kColBlock = 32;      // columns per column-sum CTA (a warp's lanes), kThreads / 32 row lanes
constexpr int64_t kGemmSmem = int64_t(sizeof(SimtMma::Storage)) + kBM * 8;  // MMA storage, then a per-row table

// The weight-gradient GEMMs G (N,Kd) = D (M,N)^T X (M,Kd).
enum WeightGemm : int {
  wg_cand,    // W_cand (r,d):          dbc^T E[ids]                                    over C
  wg_slot,    // W_ctx, W_pair (3r,d):  [dgc|dP|dQ]^T hidden                            over S
  wg_fuse_b,  // W_fuse[:, :r] (r,r):   dzc^T b^                                        over C
  wg_fuse_g,  // W_fuse[:, r:] (r,r):   dzs^T g^                                        over S
  wg_w1s,     // W1_s (H,r):            du^T s                                          over Tn
  wg_w1ab,    // W1_a, W1_b (2H,r):     [dpred|dsucc]^T z                               over C
  kWeightGemms
};
// The column sums: gamma, beta (over candidates), b1, w2 (over transitions), w_la, w_lb (over candidates),
// b2 (every element of the (Tn K, K) incoming gradient).
enum ColumnSum : int { cs_gamma, cs_beta, cs_b1, cs_w2, cs_la, cs_lb, cs_b2, kColumnSums };

struct Split {
  int64_t N, Kd, M;   // result (N,Kd), reduced over M rows
  int64_t mt, nt;     // tiles of the result
  int64_t span, splits;  // rows per split, splits
  float* part;           // partials (splits,N,Kd)
};

struct ColSum {
  int64_t rows, cols, cb, chunks;  // column blocks of kColBlock, chunks of kColRows
  float* part;                     // partials (chunks,cols)
};

// A row-major (rows, cols) float matrix in the workspace: m[i] is row i.
struct Rows {
  float* data = nullptr;
  int64_t cols = 0;
  __host__ __device__ float* operator[](int64_t i) const { return data + i * cols; }
};

// What the workspace holds, each view named for its contents (the kernel that writes it in brackets): S slots,
// C = S K candidates, Tn transitions; "units" are the hidden units of the transition MLP's first layer.
struct GradWorkspace {
  Rows ctx;                    // (S,r)  W_ctx h (slot_proj), then g^ = LN of it, in place (ln_inputs)
  float* ctx_inv_std;          // (S)    its 1/sigma (ln_inputs)
  Rows pair_left, pair_right;  // (S,r)  W_pair_L h, W_pair_R h (slot_proj): s_p = left_p + right_{p+1}
  Rows cand;                   // (C,r)  W_cand E[id] (cand_proj), then b^ = LN of it, in place (ln_inputs)
  float* cand_inv_std;         // (C)    its 1/sigma (ln_inputs)
  Rows fuse_hat;               // (C,r)  W_fuse [b^ ; g^] (fuse), then z^ = LN of it without the affine (ln_fuse)
  float* fuse_inv_std;         // (C)    its 1/sigma (ln_fuse)
  Rows fused;                  // (C,r)  z = gamma z^ + beta (ln_fuse)
  Rows pred_units, succ_units;  // (C,H) W1_a z + w_la l, W1_b z + w_lb l (pred_succ)
  Rows pair_units;             // (Tn,H) u = W1_s s + b1 (pair)
  Rows d_pair_units;           // (Tn,H) dL/du (transition)
  Rows d_pred_units, d_succ_units;  // (C,H) dL/dpred, dL/dsucc (transition; rows no transition reads: dpred_at)
  Rows w2_terms;               // (Tn,H) each transition's terms of dL/dw2 (transition)
  float* d_logit_as_pred;      // (C)    the w_la terms of dL/dl (transition)
  float* d_logit_as_succ;      // (C)    the w_lb terms of dL/dl (transition)
  Rows d_fused;                // (C,r)  dL/dz (dz)
  Rows d_fuse_in;              // (C,r)  gamma dL/dz (dz), then dL/d(W_fuse [b^ ; g^]) through the LN (ln_z_grad)
  Rows d_cand;                 // (C,r)  dL/db^ (db), then dL/d(W_cand E[id]) through the LN (ln_b_grad)
  Rows d_fuse_in_slot;         // (S,r)  the slot's K rows of d_fuse_in summed (ln_b_grad)
  Rows d_ctx;                  // (S,r)  dL/dg^ (dg), then dL/d(W_ctx h) through the LN (ln_g_grad)
  Rows d_pair;                 // (Tn,r) dL/ds (ds)
};

// The workspace's views and the launch shapes. Built from the params alone (workspace null: the size only).
struct GradPlan {
  int64_t S, C, Tn, in;  // slots, candidates, transitions, the MLP's input width 3r+2
  GradWorkspace ws;
  Split wg[kWeightGemms];
  ColSum cs[kColumnSums];
  int64_t trans_smem;  // bytes of the transition kernel's dynamic shared memory
  int64_t floats;      // the workspace's size
};

__host__ __device__ inline GradPlan grad_plan_of(const GradParams<float>& p) {
  GradPlan plan{};
  const int64_t r = p.r, H = p.H, d = p.d, K = p.K;
  const int64_t S = p.R * p.B, C = S * K, Tn = p.R * (p.B - 1);
  plan.S = S, plan.C = C, plan.Tn = Tn, plan.in = 3 * r + 2;
  int64_t at = 0;
  auto take = [&](int64_t n) {  // n floats
    float* o = p.workspace ? p.workspace + at : nullptr;
    at += n;
    return o;
  };
  auto rows = [&](int64_t n, int64_t cols) { return Rows{take(n * cols), cols}; };
  GradWorkspace& ws = plan.ws;
  ws.ctx = rows(S, r), ws.ctx_inv_std = take(S), ws.pair_left = rows(S, r), ws.pair_right = rows(S, r);
  ws.cand = rows(C, r), ws.cand_inv_std = take(C), ws.fuse_hat = rows(C, r), ws.fuse_inv_std = take(C);
  ws.fused = rows(C, r), ws.pred_units = rows(C, H), ws.succ_units = rows(C, H), ws.pair_units = rows(Tn, H);
  ws.d_pair_units = rows(Tn, H), ws.d_pred_units = rows(C, H), ws.d_succ_units = rows(C, H);
  ws.w2_terms = rows(Tn, H), ws.d_logit_as_pred = take(C), ws.d_logit_as_succ = take(C);
  ws.d_fused = rows(C, r), ws.d_fuse_in = rows(C, r), ws.d_cand = rows(C, r), ws.d_fuse_in_slot = rows(S, r);
  ws.d_ctx = rows(S, r), ws.d_pair = rows(Tn, r);
  const int64_t shapes[kWeightGemms][3] = {{r, d, C}, {3 * r, d, S}, {r, r, C}, {r, r, S}, {H, r, Tn}, {2 * H, r, C}};
  for (int i = 0; i < kWeightGemms; ++i) {
    Split& s = plan.wg[i];
    s.N = shapes[i][0], s.Kd = shapes[i][1], s.M = shapes[i][2];
    s.mt = cdiv(s.N, kBM), s.nt = cdiv(s.Kd, kBN);
    int64_t want = cdiv(kGradCtas, s.mt * s.nt), most = cdiv(s.M, kMinSpan);
    want = want < most ? want : most;
    s.span = cdiv(cdiv(s.M, want), kBK) * kBK, s.splits = cdiv(s.M, s.span);
    s.part = take(s.splits * s.N * s.Kd);
  }
  const int64_t sums[kColumnSums][2] = {{C, r}, {C, r}, {Tn, H}, {Tn, H}, {C, H}, {C, H}, {Tn * K, K}};
  for (int i = 0; i < kColumnSums; ++i) {
    ColSum& c = plan.cs[i];
    c.rows = sums[i][0], c.cols = sums[i][1], c.cb = cdiv(c.cols, kColBlock), c.chunks = cdiv(c.rows, kColRows);
    c.part = take(c.chunks * c.cols);
  }
  plan.trans_smem = (K * kThreads + 2 * K * (kThreads / 32)) * 4;
  plan.floats = at;
  return plan;
}

// ---- shared pieces ----

// One (kBM,kBN) tile at (m0,n0) of a problem (M,N): acc = A[m0:, k0:k1] B[n0:, k0:k1]^T with la(m,k), lb(n,k)
// taking global row indices (called only inside the problem), then out(m,n,v) for every element inside it.
template <class LA, class LB, class Out>
__device__ void simt_tile(char* smem, int64_t M, int64_t N, int64_t m0, int64_t n0, int64_t k0, int64_t k1, LA la,
                          LB lb, Out out) {
  auto& st = *reinterpret_cast<SimtMma::Storage*>(smem);
  SimtMma::Acc acc;
  tile_gemm<SimtMma>(
      st, acc, [&](int m, int64_t k) { return m0 + m < M ? la(m0 + m, k) : 0.f; },
      [&](int n, int64_t k) { return n0 + n < N ? lb(n0 + n, k) : 0.f; }, k0, k1);
  SimtMma::store(acc, [&](int m, int n, float v) {
    if (m0 + m < M && n0 + n < N) out(m0 + m, n0 + n, v);
  });
  SimtMma::end(st, acc);
}

// The tile of an output GEMM (M,N) this CTA computes: n-tiles of one row block are adjacent in launch order,
// so they run together and share the row block's A operand through L2.
__device__ inline void output_tile(int64_t N, int64_t* m0, int64_t* n0) {
  const int64_t nt = cdiv(N, kBN);
  *n0 = int64_t(blockIdx.x) % nt * kBN, *m0 = int64_t(blockIdx.x) / nt * kBM;
}

__host__ __device__ inline unsigned output_tiles(int64_t M, int64_t N) { return unsigned(cdiv(M, kBM) * cdiv(N, kBN)); }

// dL/dpred of candidate c (zero in a request's last slot: no transition reads it as predecessor) and dL/dsucc
// (zero in the first slot); the transition kernel writes only the others.
__device__ inline float dpred_at(const GradParams<float>& p, const GradPlan& plan, int64_t c, int64_t j) {
  return c / p.K % p.B + 1 < p.B ? plan.ws.d_pred_units[c][j] : 0.f;
}
__device__ inline float dsucc_at(const GradParams<float>& p, const GradPlan& plan, int64_t c, int64_t j) {
  return c / p.K % p.B > 0 ? plan.ws.d_succ_units[c][j] : 0.f;
}
// s_p = P_p + Q_{p+1} of transition t, element o.
__device__ inline float pair_in(const GradParams<float>& p, const GradPlan& plan, int64_t t, int64_t o) {
  const int64_t slot = transition_slot(t, p.B);
  return plan.ws.pair_left[slot][o] + plan.ws.pair_right[slot + 1][o];
}
// dL/dP and dL/dQ of slot i: s_p = P_p + Q_{p+1}, so slot i is the P of its own transition and the Q of the one
// before (each at most one): ds rows, or zero.
__device__ inline float dP_at(const GradParams<float>& p, const GradPlan& plan, int64_t i, int64_t o) {
  const int64_t slot = i % p.B;
  return slot + 1 < p.B ? plan.ws.d_pair[i / p.B * (p.B - 1) + slot][o] : 0.f;
}
__device__ inline float dQ_at(const GradParams<float>& p, const GradPlan& plan, int64_t i, int64_t o) {
  const int64_t slot = i % p.B;
  return slot > 0 ? plan.ws.d_pair[i / p.B * (p.B - 1) + slot - 1][o] : 0.f;
}

// The sum of v over a warp (a fixed butterfly: every lane gets the same, deterministic sum).
__device__ inline float warp_sum(float v) {
  for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// ---- forward, keeping what the backward reads ----

__global__ void __launch_bounds__(kThreads) slot_proj_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t d = p.d, r = p.r;
  const GradWorkspace& ws = plan.ws;
  int64_t m0, n0;
  output_tile(3 * r, &m0, &n0);
  auto la = [&](int64_t m, int64_t k) { return load_float(p.hidden, p.hidden_dtype, m * d + k); };
  auto lb = [&](int64_t n, int64_t k) {
    return ldg(n < r ? p.w.ctx_proj + n * d + k : p.w.pair_proj + (n % r) * 2 * d + (n < 2 * r ? 0 : d) + k);
  };
  simt_tile(smem, plan.S, 3 * r, m0, n0, 0, d, la, lb, [&](int64_t m, int64_t n, float v) {
    (n < r ? ws.ctx : n < 2 * r ? ws.pair_left : ws.pair_right)[m][n % r] = v;
  });
}

__global__ void __launch_bounds__(kThreads) cand_proj_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t d = p.d, r = p.r;
  auto* row = reinterpret_cast<int64_t*>(smem + sizeof(SimtMma::Storage));  // the tile's embedding rows
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  for (int i = threadIdx.x; i < kBM; i += kThreads) row[i] = m0 + i < plan.C ? cand_id(p, m0 + i) * d : 0;
  __syncthreads();
  auto la = [&](int64_t m, int64_t k) { return load_float(p.embed, p.embed_dtype, row[m - m0] + k); };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.cand_proj + n * d + k); };
  simt_tile(smem, plan.C, r, m0, n0, 0, d, la, lb,
            [&](int64_t m, int64_t n, float v) { plan.ws.cand[m][n] = v; });
}

// g^ = LN(g) (rows [0,S)) and b^ = LN(b) (rows [S,S+C)), in place, keeping 1/sigma.
__global__ void __launch_bounds__(kThreads) ln_inputs_kernel(GradParams<float> p, GradPlan plan) {
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r;
  const GradWorkspace& ws = plan.ws;
  if (e < plan.S)
    ws.ctx_inv_std[e] = layer_norm(ws.ctx[e], int(r), nullptr, nullptr);
  else if (e < plan.S + plan.C)
    ws.cand_inv_std[e - plan.S] = layer_norm(ws.cand[e - plan.S], int(r), nullptr, nullptr);
}

__global__ void __launch_bounds__(kThreads) fuse_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, K = p.K;
  const GradWorkspace& ws = plan.ws;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t m, int64_t k) { return k < r ? ws.cand[m][k] : ws.ctx[m / K][k - r]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.fuse_proj + n * 2 * r + k); };
  simt_tile(smem, plan.C, r, m0, n0, 0, 2 * r, la, lb,
            [&](int64_t m, int64_t n, float v) { plan.ws.fuse_hat[m][n] = v; });
}

// z^ = LN(zc) in place, keeping 1/sigma, and z = gamma z^ + beta.
__global__ void __launch_bounds__(kThreads) ln_fuse_kernel(GradParams<float> p, GradPlan plan) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r;
  if (c >= plan.C) return;
  const GradWorkspace& ws = plan.ws;
  float* zh = ws.fuse_hat[c];
  ws.fuse_inv_std[c] = layer_norm(zh, int(r), nullptr, nullptr);
  for (int64_t o = 0; o < r; ++o) ws.fused[c][o] = zh[o] * p.w.fuse_gamma[o] + p.w.fuse_beta[o];
}

__global__ void __launch_bounds__(kThreads) pred_succ_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, H = p.H, in = plan.in;
  const GradWorkspace& ws = plan.ws;
  const float* w1 = p.w.w1;
  float* lg = reinterpret_cast<float*>(smem + sizeof(SimtMma::Storage));  // the tile's candidate logits
  int64_t m0, n0;
  output_tile(2 * H, &m0, &n0);
  for (int i = threadIdx.x; i < kBM; i += kThreads)
    lg[i] = m0 + i < plan.C ? load_float(p.cand_logits, p.logits_dtype, m0 + i) : 0.f;
  __syncthreads();
  auto la = [&](int64_t m, int64_t k) { return ws.fused[m][k]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(n < H ? w1 + n * in + r + k : w1 + (n - H) * in + 2 * r + k); };
  simt_tile(smem, plan.C, 2 * H, m0, n0, 0, r, la, lb, [&](int64_t c, int64_t n, float v) {
    const bool b = n >= H;  // pred (w_la) or succ (w_lb), branch-free: the epilogue stays unrolled
    const int64_t j = b ? n - H : n;
    (b ? ws.succ_units : ws.pred_units)[c][j] = v + w1[j * in + 3 * r + b] * lg[c - m0];
  });
}

__global__ void __launch_bounds__(kThreads) pair_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, H = p.H, in = plan.in;
  int64_t m0, n0;
  output_tile(H, &m0, &n0);
  auto la = [&](int64_t t, int64_t k) { return pair_in(p, plan, t, k); };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.w1 + n * in + k); };
  simt_tile(smem, plan.Tn, H, m0, n0, 0, r, la, lb,
            [&](int64_t t, int64_t n, float v) { plan.ws.pair_units[t][n] = v + p.w.b1[n]; });
}

// ---- the grid's backward ----

// Per transition t (slot p = its predecessor slot): dL/du, dL/dpred of slot p, dL/dsucc of slot p+1, the dw2
// partials and the d_logits terms sum_j w_la[j] dpred[c,j] (dlp, slot p) and sum_j w_lb[j] dsucc[c,j] (dls, slot
// p+1). Thread tid owns unit j = j0 + tid; successors b outside, predecessors a inside, so dsucc_b is one register
// and dpred accumulates in shared memory, a column per thread (dynamic smem: dp (K,kThreads), then the per-warp
// partials of dlp and dls (K, warps) each).
__global__ void __launch_bounds__(kThreads) transition_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  constexpr int kWarps = kThreads / 32;
  float* dp = reinterpret_cast<float*>(smem);
  float* lp = dp + p.K * kThreads;
  float* ls = lp + p.K * kWarps;
  const int64_t t = blockIdx.x, K = p.K, H = p.H, slot = transition_slot(t, p.B), c0 = slot * K, c1 = c0 + K;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const float *w1 = p.w.w1, *g = p.grad + t * K * K;
  const int64_t la = 3 * p.r, lb = 3 * p.r + 1;
  const GradWorkspace& ws = plan.ws;
  for (int64_t x = tid; x < 2 * K * kWarps; x += kThreads) lp[x] = 0.f;
  __syncthreads();
  for (int64_t j0 = 0; j0 < H; j0 += kThreads) {  // every thread runs every step (the warp sums need all lanes)
    const int64_t j = j0 + tid;
    const bool on = j < H;
    const float u = on ? ws.pair_units[t][j] : 0.f, w2 = on ? p.w.w2[j] : 0.f;
    float du = 0.f, dw2 = 0.f;
    for (int64_t a = 0; a < K; ++a) dp[a * kThreads + tid] = 0.f;
    for (int64_t b = 0; b < K; ++b) {
      float ds = 0.f;
      if (on) {
        const float sb = ws.succ_units[c1 + b][j];
        for (int64_t a = 0; a < K; ++a) {
          const float dx = transition_unit_grad(u, ws.pred_units[c0 + a][j], sb, w2, g[a * K + b], &dw2);
          du += dx, ds += dx, dp[a * kThreads + tid] += dx;
        }
        ws.d_succ_units[c1 + b][j] = ds;
      }
      const float v = warp_sum(on ? w1[j * plan.in + lb] * ds : 0.f);
      if (lane == 0) ls[b * kWarps + warp] += v;
    }
    for (int64_t a = 0; a < K; ++a) {
      const float x = dp[a * kThreads + tid];
      if (on) ws.d_pred_units[c0 + a][j] = x;
      const float v = warp_sum(on ? w1[j * plan.in + la] * x : 0.f);
      if (lane == 0) lp[a * kWarps + warp] += v;
    }
    if (on) ws.d_pair_units[t][j] = du, ws.w2_terms[t][j] = dw2;
  }
  __syncthreads();
  for (int64_t a = tid; a < K; a += kThreads) {
    float vp = 0.f, vs = 0.f;
    for (int w = 0; w < kWarps; ++w) vp += lp[a * kWarps + w], vs += ls[a * kWarps + w];
    ws.d_logit_as_pred[c0 + a] = vp, ws.d_logit_as_succ[c1 + a] = vs;
  }
}

// ---- backward ----

__global__ void __launch_bounds__(kThreads) dz_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, H = p.H, in = plan.in;
  const float* w1 = p.w.w1;
  const GradWorkspace& ws = plan.ws;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t c, int64_t k) { return k < H ? dpred_at(p, plan, c, k) : dsucc_at(p, plan, c, k - H); };
  auto lb = [&](int64_t n, int64_t k) { return ldg(k < H ? w1 + k * in + r + n : w1 + (k - H) * in + 2 * r + n); };
  simt_tile(smem, plan.C, r, m0, n0, 0, 2 * H, la, lb, [&](int64_t c, int64_t n, float v) {
    ws.d_fused[c][n] = v, ws.d_fuse_in[c][n] = v * p.w.fuse_gamma[n];
  });
}

// Per candidate: dzc through z^ = LN(zc) (in place: layer_norm_grad reads dy[i] before writing dx[i]), and
// d_logits: l_{p+1}(b) enters S_p(., b) directly, and every pred/succ term through w_la, w_lb (dlp, dls).
__global__ void __launch_bounds__(kThreads) ln_z_grad_kernel(GradParams<float> p, GradPlan plan) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r, K = p.K, B = p.B;
  if (c >= plan.C) return;
  const GradWorkspace& ws = plan.ws;
  float* x = ws.d_fuse_in[c];
  layer_norm_grad(ws.fuse_hat[c], ws.fuse_inv_std[c], x, x, int(r));
  const int64_t slot = c / K % B;
  float dl = logit_grad_direct(p.grad, c, B, K);
  if (slot + 1 < B) dl += ws.d_logit_as_pred[c];
  if (slot > 0) dl += ws.d_logit_as_succ[c];
  p.d_logits[c] = dl;
}

__global__ void __launch_bounds__(kThreads) db_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r;
  const GradWorkspace& ws = plan.ws;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t c, int64_t k) { return ws.d_fuse_in[c][k]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.fuse_proj + k * 2 * r + n); };
  simt_tile(smem, plan.C, r, m0, n0, 0, r, la, lb, [&](int64_t c, int64_t n, float v) { ws.d_cand[c][n] = v; });
}

// Rows [0,C): dbc through b^ = LN(b), in place. Then S r elements: dzs, the slot's K dzc rows summed in order.
__global__ void __launch_bounds__(kThreads) ln_b_grad_kernel(GradParams<float> p, GradPlan plan) {
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r, K = p.K;
  const GradWorkspace& ws = plan.ws;
  if (e < plan.C) {
    float* x = ws.d_cand[e];
    layer_norm_grad(ws.cand[e], ws.cand_inv_std[e], x, x, int(r));
  } else if (e < plan.C + plan.S * r) {
    const int64_t i = (e - plan.C) / r, o = (e - plan.C) % r;
    float v = 0.f;
    for (int64_t k = 0; k < K; ++k) v += ws.d_fuse_in[i * K + k][o];
    ws.d_fuse_in_slot[i][o] = v;
  }
}

__global__ void __launch_bounds__(kThreads) dg_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r;
  const GradWorkspace& ws = plan.ws;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t i, int64_t k) { return ws.d_fuse_in_slot[i][k]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.fuse_proj + k * 2 * r + r + n); };
  simt_tile(smem, plan.S, r, m0, n0, 0, r, la, lb, [&](int64_t i, int64_t n, float v) { ws.d_ctx[i][n] = v; });
}

__global__ void __launch_bounds__(kThreads) ds_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, H = p.H, in = plan.in;
  const GradWorkspace& ws = plan.ws;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t t, int64_t k) { return ws.d_pair_units[t][k]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.w1 + k * in + n); };
  simt_tile(smem, plan.Tn, r, m0, n0, 0, H, la, lb, [&](int64_t t, int64_t n, float v) { ws.d_pair[t][n] = v; });
}

// Per slot: dgc through g^ = LN(g), in place over dg.
__global__ void __launch_bounds__(kThreads) ln_g_grad_kernel(GradParams<float> p, GradPlan plan) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r;
  if (i >= plan.S) return;
  const GradWorkspace& ws = plan.ws;
  float* x = ws.d_ctx[i];
  layer_norm_grad(ws.ctx[i], ws.ctx_inv_std[i], x, x, int(r));
}

// [dgc | dP | dQ] of slot i, column k of 3r.
__device__ inline float slot_grad(const GradParams<float>& p, const GradPlan& plan, int64_t i, int64_t k) {
  const int64_t r = p.r;
  return k < r ? plan.ws.d_ctx[i][k] : k < 2 * r ? dP_at(p, plan, i, k - r) : dQ_at(p, plan, i, k - 2 * r);
}

__global__ void __launch_bounds__(kThreads) d_hidden_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, d = p.d;
  int64_t m0, n0;
  output_tile(d, &m0, &n0);
  auto la = [&](int64_t i, int64_t k) { return slot_grad(p, plan, i, k); };
  auto lb = [&](int64_t n, int64_t k) {
    return ldg(k < r ? p.w.ctx_proj + k * d + n : p.w.pair_proj + (k % r) * 2 * d + (k < 2 * r ? 0 : d) + n);
  };
  simt_tile(smem, plan.S, d, m0, n0, 0, 3 * r, la, lb, [&](int64_t i, int64_t n, float v) { p.d_hidden[i * d + n] = v; });
}

// ---- weight gradients ----

// Tile (m,n) of G (N,Kd) over the rows of split `split`: blockIdx.x = m + mt (n + nt split), so the tiles of one
// row span run together and share its D and X rows through L2. Partials (splits,N,Kd), dense.
template <int W>
__global__ void __launch_bounds__(kThreads) weight_gemm_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  const Split& s = plan.wg[W];
  const int64_t bid = blockIdx.x, m = bid % s.mt, n = bid / s.mt % s.nt, split = bid / s.mt / s.nt;
  const int64_t k0 = split * s.span, k1 = k0 + s.span < s.M ? k0 + s.span : s.M;
  const int64_t r = p.r, H = p.H, d = p.d, K = p.K;
  const GradWorkspace& ws = plan.ws;
  // la(n, row): D[row, n]; lb(col, row): X[row, col]
  auto run = [&](auto la, auto lb) {
    float* part = s.part + split * s.N * s.Kd;
    simt_tile(smem, s.N, s.Kd, m * kBM, n * kBN, k0, k1, la, lb,
              [&](int64_t row, int64_t col, float v) { part[row * s.Kd + col] = v; });
  };
  if constexpr (W == wg_cand)
    run([&](int64_t o, int64_t c) { return ws.d_cand[c][o]; },
        [&](int64_t k, int64_t c) { return load_float(p.embed, p.embed_dtype, cand_id(p, c) * d + k); });
  if constexpr (W == wg_slot)
    run([&](int64_t o, int64_t i) { return slot_grad(p, plan, i, o); },
        [&](int64_t k, int64_t i) { return load_float(p.hidden, p.hidden_dtype, i * d + k); });
  if constexpr (W == wg_fuse_b)
    run([&](int64_t o, int64_t c) { return ws.d_fuse_in[c][o]; },
        [&](int64_t k, int64_t c) { return ws.cand[c][k]; });
  if constexpr (W == wg_fuse_g)
    run([&](int64_t o, int64_t i) { return ws.d_fuse_in_slot[i][o]; },
        [&](int64_t k, int64_t i) { return ws.ctx[i][k]; });
  if constexpr (W == wg_w1s)
    run([&](int64_t j, int64_t t) { return ws.d_pair_units[t][j]; },
        [&](int64_t k, int64_t t) { return pair_in(p, plan, t, k); });
  if constexpr (W == wg_w1ab)
    run([&](int64_t j, int64_t c) { return j < H ? dpred_at(p, plan, c, j) : dsucc_at(p, plan, c, j - H); },
        [&](int64_t k, int64_t c) { return ws.fused[c][k]; });
  (void)K;
}

// Row n of weight gradient W's result, in the weight's own layout.
__device__ inline float* weight_row(const GradParams<float>& p, int w, int64_t n) {
  const int64_t r = p.r, d = p.d, H = p.H, in = 3 * r + 2;
  switch (w) {
    case wg_cand: return p.d_w.cand_proj + n * d;
    case wg_slot: return n < r ? p.d_w.ctx_proj + n * d : p.d_w.pair_proj + (n % r) * 2 * d + (n < 2 * r ? 0 : d);
    case wg_fuse_b: return p.d_w.fuse_proj + n * 2 * r;
    case wg_fuse_g: return p.d_w.fuse_proj + n * 2 * r + r;
    case wg_w1s: return p.d_w.w1 + n * in;
    default: return n < H ? p.d_w.w1 + n * in + r : p.d_w.w1 + (n - H) * in + 2 * r;  // wg_w1ab
  }
}

// The partials of weight gradient W added in split order: a thread per element.
template <int W>
__global__ void __launch_bounds__(kThreads) weight_reduce_kernel(GradParams<float> p, GradPlan plan) {
  const Split& s = plan.wg[W];
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= s.N * s.Kd) return;
  float v = 0.f;
  for (int64_t split = 0; split < s.splits; ++split) v += s.part[split * s.N * s.Kd + e];
  weight_row(p, W, e / s.Kd)[e % s.Kd] = v;
}

// Element (row, col) of column sum X's matrix.
template <int X>
__device__ inline float column_term(const GradParams<float>& p, const GradPlan& plan, int64_t m, int64_t n) {
  const GradWorkspace& ws = plan.ws;
  const int64_t r = p.r, H = p.H;
  if constexpr (X == cs_gamma) return ws.d_fused[m][n] * ws.fuse_hat[m][n];
  if constexpr (X == cs_beta) return ws.d_fused[m][n];
  if constexpr (X == cs_b1) return ws.d_pair_units[m][n];
  if constexpr (X == cs_w2) return ws.w2_terms[m][n];
  if constexpr (X == cs_la) return dpred_at(p, plan, m, n) * load_float(p.cand_logits, p.logits_dtype, m);
  if constexpr (X == cs_lb) return dsucc_at(p, plan, m, n) * load_float(p.cand_logits, p.logits_dtype, m);
  if constexpr (X == cs_b2) return p.grad[m * p.K + n];
  return 0.f;
}

// One chunk of kColRows rows x kColBlock columns: lane = column, warp = row lane (rows strided by the warps),
// then the warps' sums in order (dynamic smem: kThreads floats). Partials (chunks, cols).
template <int X>
__global__ void __launch_bounds__(kThreads) column_sum_kernel(GradParams<float> p, GradPlan plan) {
  DCOCO_DYNAMIC_SMEM(smem);
  constexpr int kWarps = kThreads / 32;
  float* sh = reinterpret_cast<float*>(smem);
  const ColSum& c = plan.cs[X];
  const int64_t cb = int64_t(blockIdx.x) % c.cb, chunk = int64_t(blockIdx.x) / c.cb;
  const int64_t col = cb * kColBlock + threadIdx.x % 32, m0 = chunk * kColRows;
  const int64_t m1 = m0 + kColRows < c.rows ? m0 + kColRows : c.rows;
  float v = 0.f;
  if (col < c.cols)
    for (int64_t m = m0 + threadIdx.x / 32; m < m1; m += kWarps) v += column_term<X>(p, plan, m, col);
  sh[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x < 32 && col < c.cols) {
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += sh[w * 32 + threadIdx.x];
    c.part[chunk * c.cols + col] = s;
  }
}

// The chunks of column sum X added in order: a thread per column (b2: one thread, every column in order).
template <int X>
__global__ void __launch_bounds__(kThreads) column_reduce_kernel(GradParams<float> p, GradPlan plan) {
  const ColSum& c = plan.cs[X];
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x, in = plan.in, r = p.r;
  const float* part = c.part;
  if (X == cs_b2) {
    if (e != 0) return;
    float v = 0.f;
    for (int64_t col = 0; col < c.cols; ++col)
      for (int64_t chunk = 0; chunk < c.chunks; ++chunk) v += part[chunk * c.cols + col];
    p.d_w.b2[0] = v;
    return;
  }
  if (e >= c.cols) return;
  float v = 0.f;
  for (int64_t chunk = 0; chunk < c.chunks; ++chunk) v += part[chunk * c.cols + e];
  float* out = X == cs_gamma ? p.d_w.fuse_gamma + e
               : X == cs_beta ? p.d_w.fuse_beta + e
               : X == cs_b1   ? p.d_w.b1 + e
               : X == cs_w2   ? p.d_w.w2 + e
               : X == cs_la   ? p.d_w.w1 + e * in + 3 * r
                              : p.d_w.w1 + e * in + 3 * r + 1;
  *out = v;
}

}  // namespace dcoco::cuda
