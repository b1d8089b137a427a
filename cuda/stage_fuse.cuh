// Stage 2: one group of G slots (G K <= kBM candidate rows) x one kBN-column tile of [pred | succ] (C,2H).
//   g, P, Q  <- the stage-1 partials of the group's slots, added in split order
//   z (G K, r) = LN_gb(T[c] + W_fuse[:, r:] LN(g))   with T[c] = W_fuse[:, :r] LN(W_cand E[c]) (table or stage 1)
//   [pred | succ] (G K, kBN) = z [W1_a | W1_b]^T + [w_la | w_lb] l     (the rank split of the first MLP layer)
//   pq (G, kBN) = [W1_s P | W1_s Q]                                     (the pair term, before pairing)
#pragma once
#include "stage_project.cuh"

namespace dcoco::cuda {

template <class Mma>
__device__ void fuse(const ForwardParams& p, const Plan& l, int64_t t, char* smem, float* ws, int* counters) {
  const int64_t K = p.K, r = p.r, H = p.H, in = 3 * r + 2;
  const int64_t group = t / l.fuse_col_tiles, col0 = t % l.fuse_col_tiles * kBN;
  const int64_t G = l.group_slots, s0 = group * G, s1 = s0 + G < l.S ? s0 + G : l.S, ns = s1 - s0, rows = ns * K;
  const int64_t c0 = s0 * K;
  const int tid = threadIdx.x;
  const Weights& w = p.w;
  for (int64_t m = s0 / kBM; m <= (s1 - 1) / kBM; ++m)
    wait_for(counters + l.slot_done + m, l.slot_col_tiles * l.k_splits);
  if (!p.table)
    for (int64_t m = c0 / kBM; m <= (c0 + rows - 1) / kBM; ++m)
      wait_for(counters + l.cand_done + m, l.cand_col_tiles * l.k_splits);
  auto at = [&](int64_t offset) { return reinterpret_cast<float*>(smem + offset); };
  float *z = at(l.fuse_z), *c = at(l.fuse_c), *g = at(l.fuse_g), *gf = at(l.fuse_gf);
  float *P = at(l.fuse_p), *Q = at(l.fuse_q);

  for (int64_t j = tid; j < ns * 3 * r; j += kThreads) {
    const int64_t s = j / (3 * r), o = j % (3 * r);
    float sum = 0.f;
    for (int64_t split = 0; split < l.k_splits; ++split)
      sum += ws[l.slot_partials + (split * l.S + s0 + s) * 3 * r + o];
    (o < r ? g : o < 2 * r ? P : Q)[s * r + o % r] = sum;
  }
  if (!p.table)
    for (int64_t j = tid; j < rows * r; j += kThreads) {
      float sum = 0.f;
      for (int64_t split = 0; split < l.k_splits; ++split) sum += ws[l.cand_partials + (split * l.C + c0) * r + j];
      c[j] = sum;
    }
  __syncthreads();
  for (int64_t s = tid; s < ns; s += kThreads) layer_norm(g + s * r, int(r), nullptr, nullptr);
  if (!p.table)
    for (int64_t row = tid; row < rows; row += kThreads) layer_norm(c + row * r, int(r), nullptr, nullptr);
  __syncthreads();
  for (int64_t j = tid; j < ns * r; j += kThreads) gf[j] = wdot(w.fuse_proj + j % r * 2 * r + r, g + j / r * r, r);
  __syncthreads();
  for (int64_t j = tid; j < rows * r; j += kThreads) {
    const int64_t row = j / r, o = j % r;
    const float b = p.table ? p.table[cand_id(p, c0 + row) * r + o] : wdot(w.fuse_proj + o * 2 * r, c + row * r, r);
    z[j] = b + gf[row / K * r + o];
  }
  __syncthreads();
  for (int64_t row = tid; row < rows; row += kThreads) layer_norm(z + row * r, int(r), w.fuse_gamma, w.fuse_beta);
  for (int64_t j = tid; j < ns * kBN; j += kThreads) {
    const int64_t s = j / kBN, col = col0 + j % kBN;
    if (col < 2 * H)
      ws[l.pair_parts + (s0 + s) * 2 * H + col] = wdot(w.w1 + col % H * in, (col < H ? P : Q) + s * r, r);
  }
  __syncthreads();
  auto& st = *reinterpret_cast<typename Mma::Storage*>(smem + l.fuse_mma);
  auto la = [&](int m, int64_t k) { return m < rows ? z[m * r + k] : 0.f; };
  auto lb = [&](int n, int64_t k) {
    const int64_t col = col0 + n;
    return col < H ? ldg(w.w1 + col * in + r + k) : col < 2 * H ? ldg(w.w1 + (col - H) * in + 2 * r + k) : 0.f;
  };
  typename Mma::Acc acc;
  tile_gemm<Mma>(st, acc, la, lb, 0, r);
  Mma::store(acc, [&](int m, int n, float v) {
    const int64_t col = col0 + n, cand = c0 + m;
    if (m >= rows || col >= 2 * H) return;
    const float lg = cand_logit(p, cand);
    if (col < H)
      ws[l.pred + cand * H + col] = v + w.w1[col * in + 3 * r] * lg;
    else
      ws[l.succ + cand * H + col - H] = v + w.w1[(col - H) * in + 3 * r + 1] * lg;
  });
  Mma::end(st, acc);
  arrive(counters + l.group_done + group);
}

}  // namespace dcoco::cuda
