// The backward of dcoco::score on the GPU (SIMT, float32): the forward recomputed with the intermediates the
// backward reads, then the backward, in four kernels on one stream (no host sync). Each output element is
// written by one thread that sums in a fixed order: deterministic. The arithmetic is dcoco/math.h's
// (layer_norm, layer_norm_grad, transition_unit_grad), as on the CPU (cpp/cpu/grad.cpp has the derivation).
#pragma once
#include "stage_project.cuh"  // cand_id, cand_logit, warp_dot, wdot, kThreads

namespace dcoco::cuda {

// Workspace layout, in floats.
struct GradPlan {
  int64_t S, C, Tn, in;
  int64_t g, inv_g, P, Q, b, inv_b, zhat, inv_z, z, pred, succ, s, du, dpred, dsucc, dw2, dz, dzc, dbc, dzs, dgc,
      dP, dQ, floats;
};

__host__ __device__ inline GradPlan grad_plan_of(const GradParams<float>& p) {
  GradPlan l{};
  const int64_t r = p.r, H = p.H;
  l.S = p.R * p.B, l.C = l.S * p.K, l.Tn = p.R * (p.B - 1), l.in = 3 * r + 2;
  int64_t at = 0;
  auto take = [&](int64_t n) { const int64_t o = at; at += n; return o; };
  l.g = take(l.S * r), l.inv_g = take(l.S), l.P = take(l.S * r), l.Q = take(l.S * r);
  l.b = take(l.C * r), l.inv_b = take(l.C), l.zhat = take(l.C * r), l.inv_z = take(l.C), l.z = take(l.C * r);
  l.pred = take(l.C * H), l.succ = take(l.C * H), l.s = take(l.Tn * r), l.du = take(l.Tn * H);
  l.dpred = take(l.C * H), l.dsucc = take(l.C * H), l.dw2 = take(l.Tn * H), l.dz = take(l.C * r);
  l.dzc = take(l.C * r), l.dbc = take(l.C * r), l.dzs = take(l.S * r), l.dgc = take(l.S * r);
  l.dP = take(l.S * r), l.dQ = take(l.S * r), l.floats = at;
  return l;
}

// 1. Per slot: g^, P, Q; b^, z^, z, pred, succ of its K candidates (dynamic smem: gf (r)).
__global__ void __launch_bounds__(kThreads) grad_forward_kernel(GradParams<float> p) {
  DCOCO_DYNAMIC_SMEM(smem);
  float* gf = reinterpret_cast<float*>(smem);
  const GradPlan l = grad_plan_of(p);
  const int64_t i = blockIdx.x, K = p.K, d = p.d, r = p.r, H = p.H, in = l.in, c0 = i * K;
  const int tid = threadIdx.x, warp = tid / 32, warps = kThreads / 32;
  const WeightsOf<float>& w = p.w;
  float* ws = p.workspace;
  for (int64_t o = warp; o < (3 + K) * r; o += warps) {  // a warp per d-wide dot product
    float v;
    if (o < 3 * r) {
      const float* row = o < r ? w.ctx_proj + o * d : w.pair_proj + (o % r) * 2 * d + (o < 2 * r ? 0 : d);
      v = warp_dot(p.hidden, p.hidden_dtype, i * d, row, d);
    } else {
      const int64_t c = c0 + (o - 3 * r) / r, oo = (o - 3 * r) % r;
      v = warp_dot(p.embed, p.embed_dtype, cand_id(p, c) * d, w.cand_proj + oo * d, d);
    }
    if (tid % 32 == 0) ws[o < r ? l.g + i * r + o : o < 2 * r ? l.P + i * r + o - r : o < 3 * r ? l.Q + i * r + o - 2 * r
                                                                                         : l.b + c0 * r + o - 3 * r] = v;
  }
  __syncthreads();
  if (tid == 0) ws[l.inv_g + i] = layer_norm(ws + l.g + i * r, int(r), nullptr, nullptr);
  for (int64_t k = tid; k < K; k += kThreads) ws[l.inv_b + c0 + k] = layer_norm(ws + l.b + (c0 + k) * r, int(r), nullptr, nullptr);
  __syncthreads();
  for (int64_t o = tid; o < r; o += kThreads) gf[o] = wdot(w.fuse_proj + o * 2 * r + r, ws + l.g + i * r, r);
  __syncthreads();
  for (int64_t j = tid; j < K * r; j += kThreads)
    ws[l.zhat + c0 * r + j] = wdot(w.fuse_proj + j % r * 2 * r, ws + l.b + (c0 + j / r) * r, r) + gf[j % r];
  __syncthreads();
  for (int64_t k = tid; k < K; k += kThreads) {
    float* zh = ws + l.zhat + (c0 + k) * r;
    ws[l.inv_z + c0 + k] = layer_norm(zh, int(r), nullptr, nullptr);
    for (int64_t o = 0; o < r; ++o) ws[l.z + (c0 + k) * r + o] = zh[o] * w.fuse_gamma[o] + w.fuse_beta[o];
  }
  __syncthreads();
  for (int64_t j = tid; j < K * H; j += kThreads) {
    const int64_t c = c0 + j / H, h = j % H;
    const float lg = load_float(p.cand_logits, p.logits_dtype, c), *z = ws + l.z + c * r;
    ws[l.pred + c * H + h] = wdot(w.w1 + h * in + r, z, r) + w.w1[h * in + 3 * r] * lg;
    ws[l.succ + c * H + h] = wdot(w.w1 + h * in + 2 * r, z, r) + w.w1[h * in + 3 * r + 1] * lg;
  }
}

// 2. Per transition: u, and dL/du, dL/dpred (slot p), dL/dsucc (slot p+1), the dw2 partials; thread j owns
// unit j of every row it writes (dynamic smem: s (r)).
__global__ void __launch_bounds__(kThreads) grad_transition_kernel(GradParams<float> p) {
  DCOCO_DYNAMIC_SMEM(smem);
  float* s = reinterpret_cast<float*>(smem);
  const GradPlan l = grad_plan_of(p);
  const int64_t t = blockIdx.x, K = p.K, r = p.r, H = p.H, in = l.in, slot = transition_slot(t, p.B);
  const int64_t c0 = slot * K, c1 = c0 + K;
  float* ws = p.workspace;
  for (int64_t o = threadIdx.x; o < r; o += kThreads)
    s[o] = ws[l.s + t * r + o] = ws[l.P + slot * r + o] + ws[l.Q + (slot + 1) * r + o];
  __syncthreads();
  for (int64_t j = threadIdx.x; j < H; j += kThreads) {
    const float u = wdot(p.w.w1 + j * in, s, r) + p.w.b1[j], w2 = p.w.w2[j];
    float du = 0.f, dw2 = 0.f, dsucc[kMaxCandidates];
    for (int64_t b = 0; b < K; ++b) dsucc[b] = 0.f;
    for (int64_t a = 0; a < K; ++a) {
      const float pa = ws[l.pred + (c0 + a) * H + j];
      float dpred = 0.f;
      for (int64_t b = 0; b < K; ++b) {
        const float dx = transition_unit_grad(u, pa, ws[l.succ + (c1 + b) * H + j], w2, p.grad[(t * K + a) * K + b], &dw2);
        du += dx, dpred += dx, dsucc[b] += dx;
      }
      ws[l.dpred + (c0 + a) * H + j] = dpred;
    }
    for (int64_t b = 0; b < K; ++b) ws[l.dsucc + (c1 + b) * H + j] = dsucc[b];
    ws[l.du + t * H + j] = du, ws[l.dw2 + t * H + j] = dw2;
  }
}

// 3. Per slot: d_logits of its candidates, dz, dzc, dbc, dzs, dgc, dP, dQ and d_hidden (dynamic smem: dg (r)).
// dpred of the last slot and dsucc of the first are zero: no transition writes them.
__global__ void __launch_bounds__(kThreads) grad_slot_kernel(GradParams<float> p) {
  DCOCO_DYNAMIC_SMEM(smem);
  float* dg = reinterpret_cast<float*>(smem);
  const GradPlan l = grad_plan_of(p);
  const int64_t i = blockIdx.x, B = p.B, K = p.K, d = p.d, r = p.r, H = p.H, in = l.in, c0 = i * K;
  const int64_t q = i / B, slot = i % B, t_own = q * (B - 1) + slot, t_prev = t_own - 1;
  const bool has_pred = slot + 1 < B, has_succ = slot > 0;
  const int tid = threadIdx.x;
  const WeightsOf<float>& w = p.w;
  float* ws = p.workspace;
  auto dpred = [&](int64_t c, int64_t j) { return has_pred ? ws[l.dpred + c * H + j] : 0.f; };
  auto dsucc = [&](int64_t c, int64_t j) { return has_succ ? ws[l.dsucc + c * H + j] : 0.f; };
  for (int64_t x = tid; x < K * H; x += kThreads) {  // the rows no transition wrote, for the weight sums
    if (!has_pred) ws[l.dpred + c0 * H + x] = 0.f;
    if (!has_succ) ws[l.dsucc + c0 * H + x] = 0.f;
  }
  for (int64_t k = tid; k < K; k += kThreads) {
    float dl = 0.f;
    if (has_succ)
      for (int64_t a = 0; a < K; ++a) dl += p.grad[(t_prev * K + a) * K + k];
    for (int64_t j = 0; j < H; ++j) dl += w.w1[j * in + 3 * r] * dpred(c0 + k, j) + w.w1[j * in + 3 * r + 1] * dsucc(c0 + k, j);
    p.d_logits[c0 + k] = dl;
  }
  for (int64_t x = tid; x < K * r; x += kThreads) {
    const int64_t c = c0 + x / r, o = x % r;
    float v = 0.f;
    for (int64_t j = 0; j < H; ++j) v += w.w1[j * in + r + o] * dpred(c, j) + w.w1[j * in + 2 * r + o] * dsucc(c, j);
    ws[l.dz + c * r + o] = v, ws[l.dzc + c * r + o] = v * w.fuse_gamma[o];
  }
  __syncthreads();
  for (int64_t k = tid; k < K; k += kThreads) {  // in place: layer_norm_grad reads dy[i] before writing dx[i]
    float* x = ws + l.dzc + (c0 + k) * r;
    layer_norm_grad(ws + l.zhat + (c0 + k) * r, ws[l.inv_z + c0 + k], x, x, int(r));
  }
  __syncthreads();
  for (int64_t x = tid; x < K * r; x += kThreads) {
    const int64_t c = c0 + x / r, o = x % r;
    float v = 0.f;
    for (int64_t oo = 0; oo < r; ++oo) v += w.fuse_proj[oo * 2 * r + o] * ws[l.dzc + c * r + oo];
    ws[l.dbc + c * r + o] = v;
  }
  for (int64_t o = tid; o < r; o += kThreads) {
    float v = 0.f;
    for (int64_t k = 0; k < K; ++k) v += ws[l.dzc + (c0 + k) * r + o];
    ws[l.dzs + i * r + o] = v;
  }
  __syncthreads();
  for (int64_t k = tid; k < K; k += kThreads) {
    float* x = ws + l.dbc + (c0 + k) * r;
    layer_norm_grad(ws + l.b + (c0 + k) * r, ws[l.inv_b + c0 + k], x, x, int(r));
  }
  for (int64_t o = tid; o < r; o += kThreads) {
    float v = 0.f, vp = 0.f, vq = 0.f;
    for (int64_t oo = 0; oo < r; ++oo) v += w.fuse_proj[oo * 2 * r + r + o] * ws[l.dzs + i * r + oo];
    for (int64_t j = 0; j < H; ++j) {  // s_p = P_p + Q_{p+1}: slot i is the P of its own transition, the Q of the one before
      if (has_pred) vp += w.w1[j * in + o] * ws[l.du + t_own * H + j];
      if (has_succ) vq += w.w1[j * in + o] * ws[l.du + t_prev * H + j];
    }
    dg[o] = v, ws[l.dP + i * r + o] = vp, ws[l.dQ + i * r + o] = vq;
  }
  __syncthreads();
  if (tid == 0) layer_norm_grad(ws + l.g + i * r, ws[l.inv_g + i], dg, ws + l.dgc + i * r, int(r));
  __syncthreads();
  for (int64_t k = tid; k < d; k += kThreads) {
    float v = 0.f;
    for (int64_t o = 0; o < r; ++o)
      v += w.ctx_proj[o * d + k] * ws[l.dgc + i * r + o] + w.pair_proj[o * 2 * d + k] * ws[l.dP + i * r + o] +
           w.pair_proj[o * 2 * d + d + k] * ws[l.dQ + i * r + o];
    p.d_hidden[i * d + k] = v;
  }
}

// 4. A weight gradient G(N,Kd) (row stride ldg) = D(M,N)^T X(M,Kd): a thread per element, summing its M
// terms in order. X rows are dense floats (stride ldx) or, with ids, embedding rows of any dtype.
struct OuterSum {
  int64_t M, N, Kd;
  const float* D;
  int64_t ldd;
  const void* X;
  DType xt;
  int64_t ldx;
  bool gather;  // X row m is embed[cand_ids[m]]
  float* G;
  int64_t ldg;
};

__global__ void __launch_bounds__(kThreads) outer_sum_kernel(OuterSum o, GradParams<float> p) {
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= o.N * o.Kd) return;
  const int64_t n = e / o.Kd, k = e % o.Kd;
  float v = 0.f;
  for (int64_t m = 0; m < o.M; ++m) {
    const int64_t row = o.gather ? cand_id(p, m) : m;
    v += o.D[m * o.ldd + n] * load_float(o.X, o.xt, row * o.ldx + k);
  }
  o.G[n * o.ldg + k] = v;
}

// The weight gradients as outer sums, in launch order (cuda/grad.cu and the CPU emulation run this list).
constexpr int kOuterSums = 11;

inline void outer_sums(const GradParams<float>& p, OuterSum* out) {
  const GradPlan l = grad_plan_of(p);
  const int64_t d = p.d, r = p.r, H = p.H, in = l.in;
  float* ws = p.workspace;
  const OuterSum sums[kOuterSums] = {
      {l.C, r, d, ws + l.dbc, r, p.embed, p.embed_dtype, d, true, p.d_w[0], d},                       // W_cand
      {l.S, r, d, ws + l.dgc, r, p.hidden, p.hidden_dtype, d, false, p.d_w[1], d},                    // W_ctx
      {l.C, r, r, ws + l.dzc, r, ws + l.b, DType::f32, r, false, p.d_w[2], 2 * r},                    // W_fuse[:, :r]
      {l.S, r, r, ws + l.dzs, r, ws + l.g, DType::f32, r, false, p.d_w[2] + r, 2 * r},                // W_fuse[:, r:]
      {l.S, r, d, ws + l.dP, r, p.hidden, p.hidden_dtype, d, false, p.d_w[5], 2 * d},                 // W_pair[:, :d]
      {l.S, r, d, ws + l.dQ, r, p.hidden, p.hidden_dtype, d, false, p.d_w[5] + d, 2 * d},             // W_pair[:, d:]
      {l.Tn, H, r, ws + l.du, H, ws + l.s, DType::f32, r, false, p.d_w[6], in},                       // W1_s
      {l.C, H, r, ws + l.dpred, H, ws + l.z, DType::f32, r, false, p.d_w[6] + r, in},                 // W1_a
      {l.C, H, r, ws + l.dsucc, H, ws + l.z, DType::f32, r, false, p.d_w[6] + 2 * r, in},             // W1_b
      {l.C, H, 1, ws + l.dpred, H, p.cand_logits, p.logits_dtype, 1, false, p.d_w[6] + 3 * r, in},     // w_la
      {l.C, H, 1, ws + l.dsucc, H, p.cand_logits, p.logits_dtype, 1, false, p.d_w[6] + 3 * r + 1, in},  // w_lb
  };
  for (int i = 0; i < kOuterSums; ++i) out[i] = sums[i];
}

// 5. Column sums: gamma, beta (over candidates), b1, w2 (over transitions) and b2 (over the grid).
__global__ void __launch_bounds__(kThreads) column_sum_kernel(GradParams<float> p) {
  const GradPlan l = grad_plan_of(p);
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x, r = p.r, H = p.H;
  const float* ws = p.workspace;
  if (e < r) {
    float dg = 0.f, db = 0.f;
    for (int64_t c = 0; c < l.C; ++c) dg += ws[l.dz + c * r + e] * ws[l.zhat + c * r + e], db += ws[l.dz + c * r + e];
    p.d_w[3][e] = dg, p.d_w[4][e] = db;
  } else if (e < r + H) {
    const int64_t j = e - r;
    float b1 = 0.f, w2 = 0.f;
    for (int64_t t = 0; t < l.Tn; ++t) b1 += ws[l.du + t * H + j], w2 += ws[l.dw2 + t * H + j];
    p.d_w[7][j] = b1, p.d_w[8][j] = w2;
  } else if (e == r + H) {
    float b2 = 0.f;
    for (int64_t x = 0; x < l.Tn * p.K * p.K; ++x) b2 += p.grad[x];
    p.d_w[9][0] = b2;
  }
}

}  // namespace dcoco::cuda
