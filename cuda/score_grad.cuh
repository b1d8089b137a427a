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
  int64_t span, splits, part;  // rows per split, splits, partials (splits,N,Kd) offset
};

struct ColSum {
  int64_t rows, cols, cb, chunks, part;  // column blocks of kColBlock, chunks of kColRows, partials (chunks,cols)
};

// Workspace layout, in floats, and the launch shapes.
struct GradPlan {
  int64_t S, C, Tn, in;
  int64_t g, inv_g, P, Q, b, inv_b, zhat, inv_z, z, pred, succ, u, du, dpred, dsucc, dw2, dlp, dls, dz, dzc, dbc,
      dzs, dg, ds;
  Split wg[kWeightGemms];
  ColSum cs[kColumnSums];
  int64_t trans_smem;  // bytes of the transition kernel's dynamic shared memory
  int64_t floats;
};

__host__ __device__ inline GradPlan grad_plan_of(const GradParams<float>& p) {
  GradPlan l{};
  const int64_t r = p.r, H = p.H, d = p.d, K = p.K;
  l.S = p.R * p.B, l.C = l.S * K, l.Tn = p.R * (p.B - 1), l.in = 3 * r + 2;
  int64_t at = 0;
  auto take = [&](int64_t n) { const int64_t o = at; at += n; return o; };
  l.g = take(l.S * r), l.inv_g = take(l.S), l.P = take(l.S * r), l.Q = take(l.S * r);
  l.b = take(l.C * r), l.inv_b = take(l.C), l.zhat = take(l.C * r), l.inv_z = take(l.C), l.z = take(l.C * r);
  l.pred = take(l.C * H), l.succ = take(l.C * H), l.u = take(l.Tn * H), l.du = take(l.Tn * H);
  l.dpred = take(l.C * H), l.dsucc = take(l.C * H), l.dw2 = take(l.Tn * H), l.dlp = take(l.C), l.dls = take(l.C);
  l.dz = take(l.C * r), l.dzc = take(l.C * r), l.dbc = take(l.C * r), l.dzs = take(l.S * r), l.dg = take(l.S * r);
  l.ds = take(l.Tn * r);
  const int64_t shapes[kWeightGemms][3] = {{r, d, l.C}, {3 * r, d, l.S}, {r, r, l.C},
                                           {r, r, l.S}, {H, r, l.Tn},   {2 * H, r, l.C}};
  for (int i = 0; i < kWeightGemms; ++i) {
    Split& s = l.wg[i];
    s.N = shapes[i][0], s.Kd = shapes[i][1], s.M = shapes[i][2];
    s.mt = cdiv(s.N, kBM), s.nt = cdiv(s.Kd, kBN);
    int64_t want = cdiv(kGradCtas, s.mt * s.nt), most = cdiv(s.M, kMinSpan);
    want = want < most ? want : most;
    s.span = cdiv(cdiv(s.M, want), kBK) * kBK, s.splits = cdiv(s.M, s.span);
    s.part = take(s.splits * s.N * s.Kd);
  }
  const int64_t sums[kColumnSums][2] = {{l.C, r}, {l.C, r}, {l.Tn, H}, {l.Tn, H}, {l.C, H}, {l.C, H}, {l.Tn * K, K}};
  for (int i = 0; i < kColumnSums; ++i) {
    ColSum& c = l.cs[i];
    c.rows = sums[i][0], c.cols = sums[i][1], c.cb = cdiv(c.cols, kColBlock), c.chunks = cdiv(c.rows, kColRows);
    c.part = take(c.chunks * c.cols);
  }
  l.trans_smem = (K * kThreads + 2 * K * (kThreads / 32)) * 4;
  l.floats = at;
  return l;
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
__device__ inline float dpred_at(const GradParams<float>& p, const GradPlan& l, int64_t c, int64_t j) {
  return c / p.K % p.B + 1 < p.B ? p.workspace[l.dpred + c * p.H + j] : 0.f;
}
__device__ inline float dsucc_at(const GradParams<float>& p, const GradPlan& l, int64_t c, int64_t j) {
  return c / p.K % p.B > 0 ? p.workspace[l.dsucc + c * p.H + j] : 0.f;
}
// s_p = P_p + Q_{p+1} of transition t, element o.
__device__ inline float pair_in(const GradParams<float>& p, const GradPlan& l, int64_t t, int64_t o) {
  const int64_t slot = transition_slot(t, p.B);
  return p.workspace[l.P + slot * p.r + o] + p.workspace[l.Q + (slot + 1) * p.r + o];
}
// dL/dP and dL/dQ of slot i: s_p = P_p + Q_{p+1}, so slot i is the P of its own transition and the Q of the one
// before (each at most one): ds rows, or zero.
__device__ inline float dP_at(const GradParams<float>& p, const GradPlan& l, int64_t i, int64_t o) {
  const int64_t slot = i % p.B;
  return slot + 1 < p.B ? p.workspace[l.ds + (i / p.B * (p.B - 1) + slot) * p.r + o] : 0.f;
}
__device__ inline float dQ_at(const GradParams<float>& p, const GradPlan& l, int64_t i, int64_t o) {
  const int64_t slot = i % p.B;
  return slot > 0 ? p.workspace[l.ds + (i / p.B * (p.B - 1) + slot - 1) * p.r + o] : 0.f;
}

// The sum of v over a warp (a fixed butterfly: every lane gets the same, deterministic sum).
__device__ inline float warp_sum(float v) {
  for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// ---- forward, keeping what the backward reads ----

__global__ void __launch_bounds__(kThreads) slot_proj_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t d = p.d, r = p.r;
  float* ws = p.workspace;
  int64_t m0, n0;
  output_tile(3 * r, &m0, &n0);
  auto la = [&](int64_t m, int64_t k) { return load_float(p.hidden, p.hidden_dtype, m * d + k); };
  auto lb = [&](int64_t n, int64_t k) {
    return ldg(n < r ? p.w.ctx_proj + n * d + k : p.w.pair_proj + (n % r) * 2 * d + (n < 2 * r ? 0 : d) + k);
  };
  simt_tile(smem, l.S, 3 * r, m0, n0, 0, d, la, lb, [&](int64_t m, int64_t n, float v) {
    ws[(n < r ? l.g : n < 2 * r ? l.P : l.Q) + m * r + n % r] = v;
  });
}

__global__ void __launch_bounds__(kThreads) cand_proj_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t d = p.d, r = p.r;
  auto* row = reinterpret_cast<int64_t*>(smem + sizeof(SimtMma::Storage));  // the tile's embedding rows
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  for (int i = threadIdx.x; i < kBM; i += kThreads) row[i] = m0 + i < l.C ? cand_id(p, m0 + i) * d : 0;
  __syncthreads();
  auto la = [&](int64_t m, int64_t k) { return load_float(p.embed, p.embed_dtype, row[m - m0] + k); };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.cand_proj + n * d + k); };
  simt_tile(smem, l.C, r, m0, n0, 0, d, la, lb,
            [&](int64_t m, int64_t n, float v) { p.workspace[l.b + m * r + n] = v; });
}

// g^ = LN(g) (rows [0,S)) and b^ = LN(b) (rows [S,S+C)), in place, keeping 1/sigma.
__global__ void __launch_bounds__(kThreads) ln_inputs_kernel(GradParams<float> p, GradPlan l) {
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r;
  float* ws = p.workspace;
  if (e < l.S)
    ws[l.inv_g + e] = layer_norm(ws + l.g + e * r, int(r), nullptr, nullptr);
  else if (e < l.S + l.C)
    ws[l.inv_b + e - l.S] = layer_norm(ws + l.b + (e - l.S) * r, int(r), nullptr, nullptr);
}

__global__ void __launch_bounds__(kThreads) fuse_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, K = p.K;
  const float* ws = p.workspace;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t m, int64_t k) { return k < r ? ws[l.b + m * r + k] : ws[l.g + m / K * r + k - r]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.fuse_proj + n * 2 * r + k); };
  simt_tile(smem, l.C, r, m0, n0, 0, 2 * r, la, lb,
            [&](int64_t m, int64_t n, float v) { p.workspace[l.zhat + m * r + n] = v; });
}

// z^ = LN(zc) in place, keeping 1/sigma, and z = gamma z^ + beta.
__global__ void __launch_bounds__(kThreads) ln_fuse_kernel(GradParams<float> p, GradPlan l) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r;
  if (c >= l.C) return;
  float* ws = p.workspace;
  float* zh = ws + l.zhat + c * r;
  ws[l.inv_z + c] = layer_norm(zh, int(r), nullptr, nullptr);
  for (int64_t o = 0; o < r; ++o) ws[l.z + c * r + o] = zh[o] * p.w.fuse_gamma[o] + p.w.fuse_beta[o];
}

__global__ void __launch_bounds__(kThreads) pred_succ_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, H = p.H, in = l.in;
  float* ws = p.workspace;
  const float* w1 = p.w.w1;
  float* lg = reinterpret_cast<float*>(smem + sizeof(SimtMma::Storage));  // the tile's candidate logits
  int64_t m0, n0;
  output_tile(2 * H, &m0, &n0);
  for (int i = threadIdx.x; i < kBM; i += kThreads)
    lg[i] = m0 + i < l.C ? load_float(p.cand_logits, p.logits_dtype, m0 + i) : 0.f;
  __syncthreads();
  auto la = [&](int64_t m, int64_t k) { return ws[l.z + m * r + k]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(n < H ? w1 + n * in + r + k : w1 + (n - H) * in + 2 * r + k); };
  simt_tile(smem, l.C, 2 * H, m0, n0, 0, r, la, lb, [&](int64_t c, int64_t n, float v) {
    const bool b = n >= H;  // pred (w_la) or succ (w_lb), branch-free: the epilogue stays unrolled
    const int64_t j = b ? n - H : n;
    ws[(b ? l.succ : l.pred) + c * H + j] = v + w1[j * in + 3 * r + b] * lg[c - m0];
  });
}

__global__ void __launch_bounds__(kThreads) pair_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, H = p.H, in = l.in;
  int64_t m0, n0;
  output_tile(H, &m0, &n0);
  auto la = [&](int64_t t, int64_t k) { return pair_in(p, l, t, k); };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.w1 + n * in + k); };
  simt_tile(smem, l.Tn, H, m0, n0, 0, r, la, lb,
            [&](int64_t t, int64_t n, float v) { p.workspace[l.u + t * H + n] = v + p.w.b1[n]; });
}

// ---- the grid's backward ----

// Per transition t (slot p = its predecessor slot): dL/du, dL/dpred of slot p, dL/dsucc of slot p+1, the dw2
// partials and the d_logits terms sum_j w_la[j] dpred[c,j] (dlp, slot p) and sum_j w_lb[j] dsucc[c,j] (dls, slot
// p+1). Thread tid owns unit j = j0 + tid; successors b outside, predecessors a inside, so dsucc_b is one register
// and dpred accumulates in shared memory, a column per thread (dynamic smem: dp (K,kThreads), then the per-warp
// partials of dlp and dls (K, warps) each).
__global__ void __launch_bounds__(kThreads) transition_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  constexpr int kWarps = kThreads / 32;
  float* dp = reinterpret_cast<float*>(smem);
  float* lp = dp + p.K * kThreads;
  float* ls = lp + p.K * kWarps;
  const int64_t t = blockIdx.x, K = p.K, H = p.H, slot = transition_slot(t, p.B), c0 = slot * K, c1 = c0 + K;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const float *w1 = p.w.w1, *g = p.grad + t * K * K;
  const int64_t la = 3 * p.r, lb = 3 * p.r + 1;
  float* ws = p.workspace;
  for (int64_t x = tid; x < 2 * K * kWarps; x += kThreads) lp[x] = 0.f;
  __syncthreads();
  for (int64_t j0 = 0; j0 < H; j0 += kThreads) {  // every thread runs every step (the warp sums need all lanes)
    const int64_t j = j0 + tid;
    const bool on = j < H;
    const float u = on ? ws[l.u + t * H + j] : 0.f, w2 = on ? p.w.w2[j] : 0.f;
    float du = 0.f, dw2 = 0.f;
    for (int64_t a = 0; a < K; ++a) dp[a * kThreads + tid] = 0.f;
    for (int64_t b = 0; b < K; ++b) {
      float ds = 0.f;
      if (on) {
        const float sb = ws[l.succ + (c1 + b) * H + j];
        for (int64_t a = 0; a < K; ++a) {
          const float dx = transition_unit_grad(u, ws[l.pred + (c0 + a) * H + j], sb, w2, g[a * K + b], &dw2);
          du += dx, ds += dx, dp[a * kThreads + tid] += dx;
        }
        ws[l.dsucc + (c1 + b) * H + j] = ds;
      }
      const float v = warp_sum(on ? w1[j * l.in + lb] * ds : 0.f);
      if (lane == 0) ls[b * kWarps + warp] += v;
    }
    for (int64_t a = 0; a < K; ++a) {
      const float x = dp[a * kThreads + tid];
      if (on) ws[l.dpred + (c0 + a) * H + j] = x;
      const float v = warp_sum(on ? w1[j * l.in + la] * x : 0.f);
      if (lane == 0) lp[a * kWarps + warp] += v;
    }
    if (on) ws[l.du + t * H + j] = du, ws[l.dw2 + t * H + j] = dw2;
  }
  __syncthreads();
  for (int64_t a = tid; a < K; a += kThreads) {
    float vp = 0.f, vs = 0.f;
    for (int w = 0; w < kWarps; ++w) vp += lp[a * kWarps + w], vs += ls[a * kWarps + w];
    ws[l.dlp + c0 + a] = vp, ws[l.dls + c1 + a] = vs;
  }
}

// ---- backward ----

__global__ void __launch_bounds__(kThreads) dz_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, H = p.H, in = l.in;
  const float* w1 = p.w.w1;
  float* ws = p.workspace;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t c, int64_t k) { return k < H ? dpred_at(p, l, c, k) : dsucc_at(p, l, c, k - H); };
  auto lb = [&](int64_t n, int64_t k) { return ldg(k < H ? w1 + k * in + r + n : w1 + (k - H) * in + 2 * r + n); };
  simt_tile(smem, l.C, r, m0, n0, 0, 2 * H, la, lb, [&](int64_t c, int64_t n, float v) {
    ws[l.dz + c * r + n] = v, ws[l.dzc + c * r + n] = v * p.w.fuse_gamma[n];
  });
}

// Per candidate: dzc through z^ = LN(zc) (in place: layer_norm_grad reads dy[i] before writing dx[i]), and
// d_logits: l_{p+1}(b) enters S_p(., b) directly, and every pred/succ term through w_la, w_lb (dlp, dls).
__global__ void __launch_bounds__(kThreads) ln_z_grad_kernel(GradParams<float> p, GradPlan l) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r, K = p.K, B = p.B;
  if (c >= l.C) return;
  float* ws = p.workspace;
  float* x = ws + l.dzc + c * r;
  layer_norm_grad(ws + l.zhat + c * r, ws[l.inv_z + c], x, x, int(r));
  const int64_t slot = c / K % B;
  float dl = logit_grad_direct(p.grad, c, B, K);
  if (slot + 1 < B) dl += ws[l.dlp + c];
  if (slot > 0) dl += ws[l.dls + c];
  p.d_logits[c] = dl;
}

__global__ void __launch_bounds__(kThreads) db_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r;
  float* ws = p.workspace;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t c, int64_t k) { return ws[l.dzc + c * r + k]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.fuse_proj + k * 2 * r + n); };
  simt_tile(smem, l.C, r, m0, n0, 0, r, la, lb, [&](int64_t c, int64_t n, float v) { ws[l.dbc + c * r + n] = v; });
}

// Rows [0,C): dbc through b^ = LN(b), in place. Then S r elements: dzs, the slot's K dzc rows summed in order.
__global__ void __launch_bounds__(kThreads) ln_b_grad_kernel(GradParams<float> p, GradPlan l) {
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r, K = p.K;
  float* ws = p.workspace;
  if (e < l.C) {
    float* x = ws + l.dbc + e * r;
    layer_norm_grad(ws + l.b + e * r, ws[l.inv_b + e], x, x, int(r));
  } else if (e < l.C + l.S * r) {
    const int64_t i = (e - l.C) / r, o = (e - l.C) % r;
    float v = 0.f;
    for (int64_t k = 0; k < K; ++k) v += ws[l.dzc + (i * K + k) * r + o];
    ws[l.dzs + i * r + o] = v;
  }
}

__global__ void __launch_bounds__(kThreads) dg_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r;
  float* ws = p.workspace;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t i, int64_t k) { return ws[l.dzs + i * r + k]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.fuse_proj + k * 2 * r + r + n); };
  simt_tile(smem, l.S, r, m0, n0, 0, r, la, lb, [&](int64_t i, int64_t n, float v) { ws[l.dg + i * r + n] = v; });
}

__global__ void __launch_bounds__(kThreads) ds_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, H = p.H, in = l.in;
  float* ws = p.workspace;
  int64_t m0, n0;
  output_tile(r, &m0, &n0);
  auto la = [&](int64_t t, int64_t k) { return ws[l.du + t * H + k]; };
  auto lb = [&](int64_t n, int64_t k) { return ldg(p.w.w1 + k * in + n); };
  simt_tile(smem, l.Tn, r, m0, n0, 0, H, la, lb, [&](int64_t t, int64_t n, float v) { ws[l.ds + t * r + n] = v; });
}

// Per slot: dgc through g^ = LN(g), in place over dg.
__global__ void __launch_bounds__(kThreads) ln_g_grad_kernel(GradParams<float> p, GradPlan l) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r;
  if (i >= l.S) return;
  float* ws = p.workspace;
  float* x = ws + l.dg + i * r;
  layer_norm_grad(ws + l.g + i * r, ws[l.inv_g + i], x, x, int(r));
}

// [dgc | dP | dQ] of slot i, column k of 3r.
__device__ inline float slot_grad(const GradParams<float>& p, const GradPlan& l, int64_t i, int64_t k) {
  const int64_t r = p.r;
  return k < r ? p.workspace[l.dg + i * r + k] : k < 2 * r ? dP_at(p, l, i, k - r) : dQ_at(p, l, i, k - 2 * r);
}

__global__ void __launch_bounds__(kThreads) d_hidden_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const int64_t r = p.r, d = p.d;
  int64_t m0, n0;
  output_tile(d, &m0, &n0);
  auto la = [&](int64_t i, int64_t k) { return slot_grad(p, l, i, k); };
  auto lb = [&](int64_t n, int64_t k) {
    return ldg(k < r ? p.w.ctx_proj + k * d + n : p.w.pair_proj + (k % r) * 2 * d + (k < 2 * r ? 0 : d) + n);
  };
  simt_tile(smem, l.S, d, m0, n0, 0, 3 * r, la, lb, [&](int64_t i, int64_t n, float v) { p.d_hidden[i * d + n] = v; });
}

// ---- weight gradients ----

// Tile (m,n) of G (N,Kd) over the rows of split `split`: blockIdx.x = m + mt (n + nt split), so the tiles of one
// row span run together and share its D and X rows through L2. Partials (splits,N,Kd), dense.
template <int W>
__global__ void __launch_bounds__(kThreads) weight_gemm_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  const Split& s = l.wg[W];
  const int64_t bid = blockIdx.x, m = bid % s.mt, n = bid / s.mt % s.nt, split = bid / s.mt / s.nt;
  const int64_t k0 = split * s.span, k1 = k0 + s.span < s.M ? k0 + s.span : s.M;
  const int64_t r = p.r, H = p.H, d = p.d, K = p.K;
  const float* ws = p.workspace;
  // la(n, row): D[row, n]; lb(col, row): X[row, col]
  auto run = [&](auto la, auto lb) {
    float* part = p.workspace + s.part + split * s.N * s.Kd;
    simt_tile(smem, s.N, s.Kd, m * kBM, n * kBN, k0, k1, la, lb,
              [&](int64_t row, int64_t col, float v) { part[row * s.Kd + col] = v; });
  };
  if constexpr (W == wg_cand)
    run([&](int64_t o, int64_t c) { return ws[l.dbc + c * r + o]; },
        [&](int64_t k, int64_t c) { return load_float(p.embed, p.embed_dtype, cand_id(p, c) * d + k); });
  if constexpr (W == wg_slot)
    run([&](int64_t o, int64_t i) { return slot_grad(p, l, i, o); },
        [&](int64_t k, int64_t i) { return load_float(p.hidden, p.hidden_dtype, i * d + k); });
  if constexpr (W == wg_fuse_b)
    run([&](int64_t o, int64_t c) { return ws[l.dzc + c * r + o]; },
        [&](int64_t k, int64_t c) { return ws[l.b + c * r + k]; });
  if constexpr (W == wg_fuse_g)
    run([&](int64_t o, int64_t i) { return ws[l.dzs + i * r + o]; },
        [&](int64_t k, int64_t i) { return ws[l.g + i * r + k]; });
  if constexpr (W == wg_w1s)
    run([&](int64_t j, int64_t t) { return ws[l.du + t * H + j]; },
        [&](int64_t k, int64_t t) { return pair_in(p, l, t, k); });
  if constexpr (W == wg_w1ab)
    run([&](int64_t j, int64_t c) { return j < H ? dpred_at(p, l, c, j) : dsucc_at(p, l, c, j - H); },
        [&](int64_t k, int64_t c) { return ws[l.z + c * r + k]; });
  (void)K;
}

// Row n of weight gradient W's result, in the weight's own layout.
__device__ inline float* weight_row(const GradParams<float>& p, int w, int64_t n) {
  const int64_t r = p.r, d = p.d, H = p.H, in = 3 * r + 2;
  switch (w) {
    case wg_cand: return p.d_w[0] + n * d;
    case wg_slot: return n < r ? p.d_w[1] + n * d : p.d_w[5] + (n % r) * 2 * d + (n < 2 * r ? 0 : d);
    case wg_fuse_b: return p.d_w[2] + n * 2 * r;
    case wg_fuse_g: return p.d_w[2] + n * 2 * r + r;
    case wg_w1s: return p.d_w[6] + n * in;
    default: return n < H ? p.d_w[6] + n * in + r : p.d_w[6] + (n - H) * in + 2 * r;  // wg_w1ab
  }
}

// The partials of weight gradient W added in split order: a thread per element.
template <int W>
__global__ void __launch_bounds__(kThreads) weight_reduce_kernel(GradParams<float> p, GradPlan l) {
  const Split& s = l.wg[W];
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= s.N * s.Kd) return;
  float v = 0.f;
  for (int64_t split = 0; split < s.splits; ++split) v += p.workspace[s.part + split * s.N * s.Kd + e];
  weight_row(p, W, e / s.Kd)[e % s.Kd] = v;
}

// Element (row, col) of column sum X's matrix.
template <int X>
__device__ inline float column_term(const GradParams<float>& p, const GradPlan& l, int64_t m, int64_t n) {
  const float* ws = p.workspace;
  const int64_t r = p.r, H = p.H;
  if constexpr (X == cs_gamma) return ws[l.dz + m * r + n] * ws[l.zhat + m * r + n];
  if constexpr (X == cs_beta) return ws[l.dz + m * r + n];
  if constexpr (X == cs_b1) return ws[l.du + m * H + n];
  if constexpr (X == cs_w2) return ws[l.dw2 + m * H + n];
  if constexpr (X == cs_la) return dpred_at(p, l, m, n) * load_float(p.cand_logits, p.logits_dtype, m);
  if constexpr (X == cs_lb) return dsucc_at(p, l, m, n) * load_float(p.cand_logits, p.logits_dtype, m);
  if constexpr (X == cs_b2) return p.grad[m * p.K + n];
  return 0.f;
}

// One chunk of kColRows rows x kColBlock columns: lane = column, warp = row lane (rows strided by the warps),
// then the warps' sums in order (dynamic smem: kThreads floats). Partials (chunks, cols).
template <int X>
__global__ void __launch_bounds__(kThreads) column_sum_kernel(GradParams<float> p, GradPlan l) {
  DCOCO_DYNAMIC_SMEM(smem);
  constexpr int kWarps = kThreads / 32;
  float* sh = reinterpret_cast<float*>(smem);
  const ColSum& c = l.cs[X];
  const int64_t cb = int64_t(blockIdx.x) % c.cb, chunk = int64_t(blockIdx.x) / c.cb;
  const int64_t col = cb * kColBlock + threadIdx.x % 32, m0 = chunk * kColRows;
  const int64_t m1 = m0 + kColRows < c.rows ? m0 + kColRows : c.rows;
  float v = 0.f;
  if (col < c.cols)
    for (int64_t m = m0 + threadIdx.x / 32; m < m1; m += kWarps) v += column_term<X>(p, l, m, col);
  sh[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x < 32 && col < c.cols) {
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += sh[w * 32 + threadIdx.x];
    p.workspace[c.part + chunk * c.cols + col] = s;
  }
}

// The chunks of column sum X added in order: a thread per column (b2: one thread, every column in order).
template <int X>
__global__ void __launch_bounds__(kThreads) column_reduce_kernel(GradParams<float> p, GradPlan l) {
  const ColSum& c = l.cs[X];
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x, in = l.in, r = p.r;
  const float* part = p.workspace + c.part;
  if (X == cs_b2) {
    if (e != 0) return;
    float v = 0.f;
    for (int64_t col = 0; col < c.cols; ++col)
      for (int64_t chunk = 0; chunk < c.chunks; ++chunk) v += part[chunk * c.cols + col];
    p.d_w[9][0] = v;
    return;
  }
  if (e >= c.cols) return;
  float v = 0.f;
  for (int64_t chunk = 0; chunk < c.chunks; ++chunk) v += part[chunk * c.cols + e];
  float* out = X == cs_gamma ? p.d_w[3] + e
               : X == cs_beta ? p.d_w[4] + e
               : X == cs_b1   ? p.d_w[7] + e
               : X == cs_w2   ? p.d_w[8] + e
               : X == cs_la   ? p.d_w[6] + e * in + 3 * r
                              : p.d_w[6] + e * in + 3 * r + 1;
  *out = v;
}

}  // namespace dcoco::cuda
