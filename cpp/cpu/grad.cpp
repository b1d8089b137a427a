// The training path (cpu::score_grad), for T = float or double: the score grid recomputed with the
// intermediates its backward reads, then the backward written out by hand. Rows are threaded in blocks;
// every sum over rows runs in a fixed order, so results do not depend on the thread count.
//
// Forward (docs/spec.md, "Exact rewrites": rank-split first MLP layer; hats are LayerNorm outputs before any affine):
//   b^ = LN(W_cand E[c])  g^ = LN(W_ctx h)  P = W_pair_L h  Q = W_pair_R h
//   z^ = LN(W_fuse_b b^ + W_fuse_g g^)  z = gamma z^ + beta
//   pred = W1_a z + w_la l   succ = W1_b z + w_lb l   u_p = W1_s (P_p + Q_{p+1}) + b1
//   S_p(a,b) = l_{p+1}(b) + b2 + w2 . gelu(u_p + pred_pa + succ_{p+1,b})
#include <algorithm>
#include <iterator>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"
#include "dcoco/api.h"
#include "grad_kernels.h"
#include "kernels.h"

namespace dcoco::cpu {
namespace {

constexpr int64_t kRows = 32;  // rows per task
constexpr int64_t kCols = 64;  // columns of a weight gradient per task

// Row stride of a staging buffer of w-wide rows, padded by 64 bytes: unpadded, rows of a power-of-two width
// start a multiple of 4 KiB apart and all fall into the same L1 sets.
constexpr int64_t padded(int64_t w) { return w + 16; }

// f(i0, m) over [0,n) in blocks of kRows rows.
template <class F>
void blocks(int64_t n, F&& f) {
  parallel_for((n + kRows - 1) / kRows, [&](int64_t t) { f(t * kRows, std::min(kRows, n - t * kRows)); });
}

// G(N,Kd) += D(M,N)^T X(M,Kd), threaded over column chunks of Kd; rows(m0, m, k0, w, buf, &ld) fills buf
// (m,w) with X[m0:m0+m, k0:k0+w] and returns it.
template <class T, class Rows>
void weight_grad(int64_t M, int64_t N, int64_t Kd, const T* D, int64_t ldd, Rows rows, T* G, int64_t ldg) {
  constexpr int64_t kSpan = 512;  // rows per accumulation pass: G is updated once per pass
  parallel_for((Kd + kCols - 1) / kCols, [&](int64_t c) {
    const int64_t k0 = c * kCols, w = std::min(kCols, Kd - k0);
    thread_local std::vector<T> buf;
    buf.resize(kSpan * padded(kCols));
    for (int64_t m0 = 0; m0 < M; m0 += kSpan) {
      const int64_t m = std::min(kSpan, M - m0);
      int64_t ld = w;
      const T* x = rows(m0, m, k0, w, buf.data(), &ld);
      tn(m, N, D + m0 * ldd, ldd, x, ld, G + k0, ldg, w);
    }
  });
}

// out(n) = src[i0 : i0+n] as T, the dtype dispatched outside the loop so it vectorises.
template <class T>
void convert(const void* src, DType t, int64_t i0, int64_t n, T* out) {
  const auto* h = static_cast<const uint16_t*>(src) + i0;
  switch (t) {
    case DType::bf16: for (int64_t i = 0; i < n; ++i) out[i] = T(bf16_to_float(h[i])); break;
    case DType::f16: for (int64_t i = 0; i < n; ++i) out[i] = T(f16_to_float(h[i])); break;
    case DType::f64: for (int64_t i = 0; i < n; ++i) out[i] = T(static_cast<const double*>(src)[i0 + i]); break;
    default: for (int64_t i = 0; i < n; ++i) out[i] = T(static_cast<const float*>(src)[i0 + i]);
  }
}

// Rows of a dense X copied into the chunk buffer (rows of X lie d apart, a multiple of 4 KiB).
template <class T>
auto dense(const T* X, int64_t ldx) {
  return [=](int64_t m0, int64_t m, int64_t k0, int64_t w, T* buf, int64_t* ld) {
    *ld = padded(w);
    for (int64_t i = 0; i < m; ++i) std::copy(X + (m0 + i) * ldx + k0, X + (m0 + i) * ldx + k0 + w, buf + i * *ld);
    return static_cast<const T*>(buf);
  };
}

// The calling thread's buffers, kept between calls: no allocation or page fault on the hot path.
template <class T>
class Scratch {
 public:
  T* raw(int64_t n) {
    std::vector<T>& v = pool()[next_++];
    if (int64_t(v.size()) < n) v.resize(n);
    return v.data();
  }
  T* zeros(int64_t n) {
    T* x = raw(n);
    std::fill(x, x + n, T(0));
    return x;
  }

 private:
  static std::vector<std::vector<T>>& pool() {
    thread_local std::vector<std::vector<T>> slots(40);  // never resized: slot data stays put
    return slots;
  }
  size_t next_ = 0;
};

// Y(m,N) = X(m,Kd) W(N,Kd)^T, the d-wide projections' hot loop, for m <= kRows rows of X: rows `rows` of src
// (dtype t, Kd wide), or row0.. when rows is null. Floats take the forward's lane-block kernel
// (kernels.h), doubles a converted copy and the generic one.
template <class T>
void project(int64_t m, int64_t N, int64_t Kd, const void* src, DType t, const int64_t* rows, int64_t row0,
             const T* W, int64_t ldw, T* Y, int64_t ldy) {
  thread_local std::vector<T> x;
  if constexpr (std::is_same_v<T, float>) {
    static_assert(kRows == kLanes);
    x.resize(Kd * kLanes);
    gather_lanes(src, t, Kd, rows, row0, m, x.data());
    project_t({x.data(), kLanes}, m, {W, ldw}, N, Kd, Y, ldy);
  } else {
    x.resize(m * padded(Kd));
    for (int64_t j = 0; j < m; ++j) convert(src, t, (rows ? rows[j] : row0 + j) * Kd, Kd, x.data() + j * padded(Kd));
    nt(m, N, Kd, x.data(), padded(Kd), W, ldw, Y, ldy);
  }
}

template <class T>
void run(const GradParams<T>& p) {
  require(p.R >= 0 && p.B >= 1 && p.K >= 1 && p.d >= 1 && p.V >= 1 && p.r >= 2 && p.H >= 1,
          "dcoco.score_grad: bad sizes");
  require(p.hidden && p.cand_ids && p.cand_logits && p.embed && (p.scores || p.grad), "dcoco.score_grad: null input");
  const int64_t R = p.R, B = p.B, K = p.K, d = p.d, r = p.r, H = p.H, in = 3 * r + 2;
  const int64_t S = R * B, C = S * K, Tn = R * (B - 1);  // slots, candidates, transitions
  const WeightsOf<T>& w = p.w;
  const WeightGradsOf<T>& dw = p.d_w;
  const std::pair<T*, int64_t> weight_grads[] = {  // each gradient output and its size
      {dw.cand_proj, r * d}, {dw.ctx_proj, r * d}, {dw.fuse_proj, 2 * r * r}, {dw.fuse_gamma, r},
      {dw.fuse_beta, r},     {dw.pair_proj, 2 * r * d}, {dw.w1, H * in}, {dw.b1, H}, {dw.w2, H}, {dw.b2, 1}};
  require(!p.grad || (p.d_hidden && p.d_logits &&
                      std::all_of(std::begin(weight_grads), std::end(weight_grads), [](auto g) { return g.first; })),
          "dcoco.score_grad: gradient outputs missing");
  if (p.grad) {
    std::fill(p.d_hidden, p.d_hidden + S * d, T(0));
    std::fill(p.d_logits, p.d_logits + C, T(0));
    for (auto [out, size] : weight_grads) std::fill(out, out + size, T(0));
  }
  if (Tn == 0) return;
  const std::vector<int64_t> ids = checked_ids(p.cand_ids, p.ids_dtype, R, B, K, p.V);
  auto slot_of = [&](int64_t t) { return transition_slot(t, B); };
  Scratch<T> sc;
  T *h = sc.raw(S * d), *l = sc.raw(C);
  parallel_for(S, [&](int64_t i) { convert(p.hidden, p.hidden_dtype, i * d, d, &h[i * d]); });
  convert(p.cand_logits, p.logits_dtype, 0, C, l);
  auto embed_rows = [&](int64_t m0, int64_t m, int64_t k0, int64_t w, T* buf, int64_t* ld) {
    *ld = padded(w);
    for (int64_t i = 0; i < m; ++i) convert(p.embed, p.embed_dtype, ids[m0 + i] * d + k0, w, buf + i * *ld);
    return static_cast<const T*>(buf);
  };

  // ---- forward, keeping what the backward reads ----
  T *g = sc.raw(S * r), *P = sc.raw(S * r), *Q = sc.raw(S * r), *inv_g = sc.raw(S), *b = sc.raw(C * r),
    *inv_b = sc.raw(C);
  blocks(S, [&](int64_t i0, int64_t m) {
    project(m, r, d, p.hidden, p.hidden_dtype, nullptr, i0, w.ctx_proj, d, &g[i0 * r], r);
    project(m, r, d, p.hidden, p.hidden_dtype, nullptr, i0, w.pair_proj, 2 * d, &P[i0 * r], r);
    project(m, r, d, p.hidden, p.hidden_dtype, nullptr, i0, w.pair_proj + d, 2 * d, &Q[i0 * r], r);
    for (int64_t i = i0; i < i0 + m; ++i) inv_g[i] = layer_norm(&g[i * r], int(r), nullptr, nullptr);
  });
  blocks(C, [&](int64_t c0, int64_t m) {
    project(m, r, d, p.embed, p.embed_dtype, &ids[c0], 0, w.cand_proj, d, &b[c0 * r], r);
    for (int64_t c = c0; c < c0 + m; ++c) inv_b[c] = layer_norm(&b[c * r], int(r), nullptr, nullptr);
  });
  T *gf = sc.raw(S * r), *zhat = sc.raw(C * r), *z = sc.raw(C * r), *inv_z = sc.raw(C);
  blocks(S, [&](int64_t i0, int64_t m) { nt(m, r, r, &g[i0 * r], r, w.fuse_proj + r, 2 * r, &gf[i0 * r], r); });
  blocks(C, [&](int64_t c0, int64_t m) {
    nt(m, r, r, &b[c0 * r], r, w.fuse_proj, 2 * r, &zhat[c0 * r], r);
    for (int64_t c = c0; c < c0 + m; ++c) {
      T* zh = &zhat[c * r];
      for (int64_t o = 0; o < r; ++o) zh[o] += gf[c / K * r + o];
      inv_z[c] = layer_norm(zh, int(r), nullptr, nullptr);
      for (int64_t o = 0; o < r; ++o) z[c * r + o] = zh[o] * w.fuse_gamma[o] + w.fuse_beta[o];
    }
  });
  T *pred = sc.raw(C * H), *succ = sc.raw(C * H), *s = sc.raw(Tn * r), *u = sc.raw(Tn * H);
  blocks(C, [&](int64_t c0, int64_t m) {
    nt(m, H, r, &z[c0 * r], r, w.w1 + r, in, &pred[c0 * H], H);
    nt(m, H, r, &z[c0 * r], r, w.w1 + 2 * r, in, &succ[c0 * H], H);
    for (int64_t c = c0; c < c0 + m; ++c)
      for (int64_t j = 0; j < H; ++j)
        pred[c * H + j] += w.w1[j * in + 3 * r] * l[c], succ[c * H + j] += w.w1[j * in + 3 * r + 1] * l[c];
  });
  blocks(Tn, [&](int64_t t0, int64_t m) {
    for (int64_t t = t0; t < t0 + m; ++t)
      for (int64_t o = 0; o < r; ++o) s[t * r + o] = P[slot_of(t) * r + o] + Q[(slot_of(t) + 1) * r + o];
    nt(m, H, r, &s[t0 * r], r, w.w1, in, &u[t0 * H], H);
    for (int64_t t = t0; t < t0 + m; ++t)
      for (int64_t j = 0; j < H; ++j) u[t * H + j] += w.b1[j];
  });

  // ---- the grid and, per transition, dL/du, dL/dpred, dL/dsucc and the w2 partials ----
  const bool grads = p.grad != nullptr;
  T *du = grads ? sc.zeros(Tn * H) : nullptr, *dpred = grads ? sc.zeros(C * H) : nullptr,
    *dsucc = grads ? sc.zeros(C * H) : nullptr, *dw2 = grads ? sc.zeros(Tn * H) : nullptr;
  parallel_for(Tn, [&](int64_t t) {
    const int64_t c0 = slot_of(t) * K, c1 = c0 + K;  // slots p and p+1
    const bool g = grads;
    transition(Transition<T>{K, H, &u[t * H], &pred[c0 * H], &succ[c1 * H], &l[c1], w.w2, w.b2[0],
                             g ? p.grad + t * K * K : nullptr, p.scores ? p.scores + t * K * K : nullptr,
                             g ? &du[t * H] : nullptr, g ? &dpred[c0 * H] : nullptr, g ? &dsucc[c1 * H] : nullptr,
                             g ? &dw2[t * H] : nullptr});
  });
  if (!p.grad) return;

  // ---- backward ----
  // logits: l_{p+1}(b) enters S_p(., b) directly, and every pred/succ term through w_la, w_lb
  parallel_for(C, [&](int64_t c) {
    T dl = logit_grad_direct(p.grad, c, B, K);
    for (int64_t j = 0; j < H; ++j)
      dl += w.w1[j * in + 3 * r] * dpred[c * H + j] + w.w1[j * in + 3 * r + 1] * dsucc[c * H + j];
    p.d_logits[c] = dl;
  });
  // z: dz = W1_a^T dpred + W1_b^T dsucc; z = gamma z^ + beta; z^ = LN(zc)
  T *dz = sc.zeros(C * r), *dzc = sc.raw(C * r);
  blocks(C, [&](int64_t c0, int64_t m) {
    nn(m, r, H, &dpred[c0 * H], H, w.w1 + r, in, &dz[c0 * r], r);
    nn(m, r, H, &dsucc[c0 * H], H, w.w1 + 2 * r, in, &dz[c0 * r], r);
    std::vector<T> dy(r);
    for (int64_t c = c0; c < c0 + m; ++c) {
      for (int64_t o = 0; o < r; ++o) dy[o] = dz[c * r + o] * w.fuse_gamma[o];
      layer_norm_grad(&zhat[c * r], inv_z[c], dy.data(), &dzc[c * r], int(r));
    }
  });
  parallel_for(r, [&](int64_t o) {
    T dg = 0, db = 0;
    for (int64_t c = 0; c < C; ++c) dg += dz[c * r + o] * zhat[c * r + o], db += dz[c * r + o];
    dw.fuse_gamma[o] = dg, dw.fuse_beta[o] = db;
  });
  // fusion: zc = W_fuse_b b^ + W_fuse_g g^ (g^ shared by the slot's K candidates)
  T *db = sc.zeros(C * r), *dbc = sc.raw(C * r), *dzs = sc.zeros(S * r), *dg = sc.zeros(S * r), *dgc = sc.raw(S * r);
  blocks(C, [&](int64_t c0, int64_t m) {
    nn(m, r, r, &dzc[c0 * r], r, w.fuse_proj, 2 * r, &db[c0 * r], r);
    for (int64_t c = c0; c < c0 + m; ++c) layer_norm_grad(&b[c * r], inv_b[c], &db[c * r], &dbc[c * r], int(r));
  });
  blocks(S, [&](int64_t i0, int64_t m) {
    for (int64_t i = i0; i < i0 + m; ++i)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t o = 0; o < r; ++o) dzs[i * r + o] += dzc[(i * K + k) * r + o];
    nn(m, r, r, &dzs[i0 * r], r, w.fuse_proj + r, 2 * r, &dg[i0 * r], r);
    for (int64_t i = i0; i < i0 + m; ++i) layer_norm_grad(&g[i * r], inv_g[i], &dg[i * r], &dgc[i * r], int(r));
  });
  // pair: s_p = P_p + Q_{p+1}, ds = W1_s^T du
  T *ds = sc.zeros(Tn * r), *dP = sc.zeros(S * r), *dQ = sc.zeros(S * r);
  blocks(Tn, [&](int64_t t0, int64_t m) { nn(m, r, H, &du[t0 * H], H, w.w1, in, &ds[t0 * r], r); });
  for (int64_t t = 0; t < Tn; ++t)
    for (int64_t o = 0; o < r; ++o) dP[slot_of(t) * r + o] += ds[t * r + o], dQ[(slot_of(t) + 1) * r + o] += ds[t * r + o];
  // hidden: W_ctx^T dgc + W_pair_L^T dP + W_pair_R^T dQ
  blocks(S, [&](int64_t i0, int64_t m) {
    nn(m, d, r, &dgc[i0 * r], r, w.ctx_proj, d, p.d_hidden + i0 * d, d);
    nn(m, d, r, &dP[i0 * r], r, w.pair_proj, 2 * d, p.d_hidden + i0 * d, d);
    nn(m, d, r, &dQ[i0 * r], r, w.pair_proj + d, 2 * d, p.d_hidden + i0 * d, d);
  });
  // weights: outer products summed over rows
  weight_grad(C, r, d, dbc, r, embed_rows, dw.cand_proj, d);
  weight_grad(S, r, d, dgc, r, dense(h, d), dw.ctx_proj, d);
  weight_grad(C, r, r, dzc, r, dense(b, r), dw.fuse_proj, 2 * r);
  weight_grad(S, r, r, dzs, r, dense(g, r), dw.fuse_proj + r, 2 * r);
  weight_grad(S, r, d, dP, r, dense(h, d), dw.pair_proj, 2 * d);
  weight_grad(S, r, d, dQ, r, dense(h, d), dw.pair_proj + d, 2 * d);
  weight_grad(Tn, H, r, du, H, dense(s, r), dw.w1, in);
  weight_grad(C, H, r, dpred, H, dense(z, r), dw.w1 + r, in);
  weight_grad(C, H, r, dsucc, H, dense(z, r), dw.w1 + 2 * r, in);
  weight_grad(C, H, 1, dpred, H, dense(l, 1), dw.w1 + 3 * r, in);
  weight_grad(C, H, 1, dsucc, H, dense(l, 1), dw.w1 + 3 * r + 1, in);
  parallel_for(H, [&](int64_t j) {
    T b1 = 0, w2 = 0;
    for (int64_t t = 0; t < Tn; ++t) b1 += du[t * H + j], w2 += dw2[t * H + j];
    dw.b1[j] = b1, dw.w2[j] = w2;
  });
  T b2 = 0;
  for (int64_t i = 0; i < Tn * K * K; ++i) b2 += p.grad[i];
  dw.b2[0] = b2;
}

}  // namespace

void score_grad(const GradParams<float>& p) { run(p); }
void score_grad(const GradParams<double>& p) { run(p); }

}  // namespace dcoco::cpu
