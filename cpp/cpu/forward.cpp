// The CPU path: the corrector's forward from the shared arithmetic (dcoco/math.h), threaded with
// OpenMP over blocks of 32 rows (slots, candidates, pairs) and over requests for the walk.
// Rank-split first MLP layer (docs/spec.md, "Exact rewrites"): per pair u, per predecessor a, per successor b;
// the K^2 part is adds + GELU + a dot with w2, and the greedy walk scores only the chosen predecessor's row.
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dcoco/api.h"
#include "common.h"
#include "select.h"
#include "dcoco/walk.h"
#include "kernels.h"

namespace dcoco::cpu {
namespace {

// f(i0, m) over [0,n) in blocks of kLanes rows.
template <class F>
void parallel_blocks(int64_t n, F&& f) {
  parallel_for((n + kLanes - 1) / kLanes, [&](int64_t t) { f(t * kLanes, std::min(kLanes, n - t * kLanes)); });
}

// The calling thread's workspace: grows, is kept, and is never zero-filled, so large per-call
// buffers cost no page faults or memsets on the hot path.
float* arena(int64_t n) {
  thread_local std::unique_ptr<float[]> buf;
  thread_local int64_t cap = 0;
  if (n > cap) buf.reset(new float[n]), cap = n;
  return buf.get();
}

// A worker's small scratch (lane blocks, one walk row), reused across calls.
float* scratch(int slot, int64_t n) {
  thread_local std::vector<float> bufs[2];
  if (int64_t(bufs[slot].size()) < n) bufs[slot].resize(n);
  return bufs[slot].data();
}

// out(n,r) = W_fuse[:, :r] LN(W_cand E[rows]): the candidate half of the fusion, before W_fuse[:, r:] g.
void cand_rows(const void* embed, DType et, int64_t d, int64_t r, const float* cand_proj, const float* fuse_proj,
               const int64_t* rows, int64_t n, float* out) {
  parallel_blocks(n, [&](int64_t i0, int64_t m) {
    float* xt = scratch(0, std::max(d, r) * kLanes);
    float* b = scratch(1, kLanes * r);
    gather_lanes(embed, et, d, rows ? rows + i0 : nullptr, i0, m, xt);
    project_t({xt, kLanes}, m, {cand_proj, d}, r, d, b, r);
    for (int64_t i = 0; i < m; ++i) layer_norm(b + i * r, int(r), nullptr, nullptr);
    to_lanes({b, r}, m, r, xt);
    project_t({xt, kLanes}, m, {fuse_proj, 2 * r}, r, r, out + i0 * r, r);
  });
}

void check_shapes(const ForwardParams& p) {
  require(p.R >= 0 && p.B >= 1 && p.K >= 1 && p.d >= 1 && p.V >= 1 && p.r >= 2 && p.H >= 1,
          "dcoco: bad sizes R=" + std::to_string(p.R) + " B=" + std::to_string(p.B) + " K=" + std::to_string(p.K) +
              " d=" + std::to_string(p.d) + " V=" + std::to_string(p.V) + " r=" + std::to_string(p.r) +
              " H=" + std::to_string(p.H));
  require(p.K <= kMaxCandidates, "cand_ids: K=" + std::to_string(p.K) + " candidates per slot exceeds the compiled maximum " +
                                     std::to_string(kMaxCandidates));
  require(p.hidden && p.cand_ids && p.cand_logits && (p.embed || p.table), "dcoco: null input pointer");
  require(p.scores || (p.ranks && p.tokens), "dcoco: nothing to compute (no scores, no ranks/tokens)");
}

}  // namespace

void forward(const ForwardParams& p) {
  check_shapes(p);
  if (p.R == 0) return;
  const int64_t R = p.R, B = p.B, K = p.K, d = p.d, r = p.r, H = p.H, in = 3 * r + 2;
  const int64_t S = R * B, C = S * K, T = R * (B - 1);  // slots, candidates, transitions (pairs)
  const Weights& w = p.w;
  const std::vector<int64_t> ids = checked_ids(p.cand_ids, p.ids_dtype, p.R, p.B, p.K, p.V);
  const bool grid = p.scores != nullptr;
  // Workspace: logits (C), hidden as lane blocks (d, kLanes) per 32 slots, per slot g, gf, P, Q (S,r),
  // z (C,r), successor terms (C,H), pair terms (T,H), and predecessor terms (C,H) when the whole grid is
  // wanted (the walk computes one row per step instead).
  const int64_t Sp = (S + kLanes - 1) / kLanes * kLanes;
  float* logit = arena(C + Sp * d + 4 * S * r + C * r + C * H + T * H + (grid ? C * H : 0));
  float *ht = logit + C, *g = ht + Sp * d, *gf = g + S * r, *P = gf + S * r, *Q = P + S * r, *z = Q + S * r;
  float *succ = z + C * r, *pair = succ + C * H, *pred = pair + T * H;
  for (int64_t i = 0; i < C; ++i) logit[i] = load_float(p.cand_logits, p.logits_dtype, i);
  auto w1 = [&](int64_t col) { return Mat{w.w1 + col, in}; };  // W1's block of input columns from col
  auto slot_of = [&](int64_t t) { return transition_slot(t, B); };

  // Per slot (S,r): g = LN(W_ctx h), P = W_pair[:, :d] h, Q = W_pair[:, d:] h. The hidden rows are
  // gathered once as lane blocks (tasks: block x slice of d), then projected by tasks (block, weight),
  // so R = 1 still uses every thread.
  const int64_t blocks = (S + kLanes - 1) / kLanes, slices = (d + 255) / 256;
  parallel_for(blocks * slices, [&](int64_t t) {
    const int64_t i0 = t / slices * kLanes, k0 = t % slices * 256;
    gather_lanes(p.hidden, p.hidden_dtype, d, nullptr, i0, std::min(kLanes, S - i0), ht + i0 * d + k0 * kLanes,
                 k0, std::min(d, k0 + 256));
  });
  const Mat mats[3] = {{w.ctx_proj, d}, {w.pair_proj, 2 * d}, {w.pair_proj + d, 2 * d}};
  float* outs[3] = {g, P, Q};
  parallel_for(3 * blocks, [&](int64_t t) {
    const int64_t i0 = t / 3 * kLanes;
    project_t({ht + i0 * d, kLanes}, std::min(kLanes, S - i0), mats[t % 3], r, d, outs[t % 3] + i0 * r, r);
  });
  // gf = W_fuse[:, r:] g after the LayerNorm.
  parallel_blocks(S, [&](int64_t i0, int64_t m) {
    float* xt = scratch(0, r * kLanes);
    for (int64_t i = i0; i < i0 + m; ++i) layer_norm(g + i * r, int(r), nullptr, nullptr);
    to_lanes({g + i0 * r, r}, m, r, xt);
    project_t({xt, kLanes}, m, {w.fuse_proj + r, 2 * r}, r, r, gf + i0 * r, r);
  });

  // Per candidate: z = LN_gb(W_fuse [b ; g]) (C,r), b from the vocabulary table when prepared; then the
  // successor terms W1_b z + w_lb l and, for the grid, the predecessor terms W1_a z + w_la l (C,H).
  if (!p.table) cand_rows(p.embed, p.embed_dtype, d, r, w.cand_proj, w.fuse_proj, ids.data(), C, z);
  parallel_blocks(C, [&](int64_t i0, int64_t m) {
    float* xt = scratch(0, r * kLanes);
    for (int64_t c = i0; c < i0 + m; ++c) {
      float* zc = z + c * r;
      const float* b = p.table ? p.table + ids[c] * r : zc;
      const float* gc = gf + (c / K) * r;
      for (int64_t j = 0; j < r; ++j) zc[j] = b[j] + gc[j];
      layer_norm(zc, int(r), w.fuse_gamma, w.fuse_beta);
    }
    to_lanes({z + i0 * r, r}, m, r, xt);
    project_t({xt, kLanes}, m, w1(2 * r), H, r, succ + i0 * H, H);
    if (grid) project_t({xt, kLanes}, m, w1(r), H, r, pred + i0 * H, H);
    for (int64_t c = i0; c < i0 + m; ++c)
      for (int64_t j = 0; j < H; ++j) {
        succ[c * H + j] += w.w1[j * in + 3 * r + 1] * logit[c];
        if (grid) pred[c * H + j] += w.w1[j * in + 3 * r] * logit[c];
      }
  });

  // Per pair (T,H): W1_s (P_p + Q_{p+1}) + b1.
  parallel_blocks(T, [&](int64_t i0, int64_t m) {
    float* xt = scratch(0, r * kLanes);
    float* s = scratch(1, kLanes * r);
    for (int64_t t = i0; t < i0 + m; ++t) {
      const int64_t slot = slot_of(t);
      for (int64_t j = 0; j < r; ++j) s[(t - i0) * r + j] = P[slot * r + j] + Q[(slot + 1) * r + j];
    }
    to_lanes({s, r}, m, r, xt);
    project_t({xt, kLanes}, m, w1(0), H, r, pair + i0 * H, H);
    for (int64_t t = i0; t < i0 + m; ++t)
      for (int64_t j = 0; j < H; ++j) pair[t * H + j] += w.b1[j];
  });

  // out[b] = S(a, b) of transition t = (request, p) for predecessor terms a_terms.
  auto score_row = [&](int64_t t, const float* a_terms, float* out) {
    const int64_t next = (slot_of(t) + 1) * K;  // first candidate of slot p+1
    cpu::score_row(pair + t * H, a_terms, succ + next * H, w.w2, int(H), w.b2[0], logit + next, int(K), out);
  };
  if (grid) {
    parallel_for(T, [&](int64_t t) {
      const int64_t c0 = slot_of(t) * K;  // first candidate of slot p
      for (int64_t a = 0; a < K; ++a) score_row(t, pred + (c0 + a) * H, p.scores + (t * K + a) * K);
    });
  }
  if (!p.ranks) return;
  parallel_for(R, [&](int64_t q) {
    int64_t* ranks = p.ranks + q * B;
    float* a_terms = scratch(0, H + K);
    float* row = a_terms + H;
    int64_t k = argmax(logit + q * B * K, int(K));
    ranks[0] = k;
    for (int64_t s = 0; s + 1 < B; ++s) {
      const int64_t t = q * (B - 1) + s, c = (q * B + s) * K + k;
      const float* scores = row;
      if (grid) {
        scores = p.scores + (t * K + k) * K;
      } else {  // greedy reads one predecessor row only
        matvec(w1(r), H, r, z + c * r, a_terms);
        for (int64_t j = 0; j < H; ++j) a_terms[j] += w.w1[j * in + 3 * r] * logit[c];
        score_row(t, a_terms, row);
      }
      ranks[s + 1] = k = argmax(scores, int(K));
    }
    for (int64_t s = 0; s < B; ++s) p.tokens[q * B + s] = ids[(q * B + s) * K + ranks[s]];
  });
}

void cand_table(const CandTableParams& p) {
  require(p.V >= 1 && p.d >= 1 && p.r >= 2 && p.embed && p.cand_proj && p.fuse_proj && p.table,
          "dcoco.cand_table: bad arguments");
  cand_rows(p.embed, p.embed_dtype, p.d, p.r, p.cand_proj, p.fuse_proj, nullptr, p.V, p.table);
}

void select(const SelectParams& p) {
  require(p.R >= 0 && p.B >= 1 && p.K >= 1 && p.K <= kMaxCandidates && (p.B == 1 || p.scores) && p.first_logits &&
              p.ranks && p.work && p.next,
          "dcoco.select: bad arguments");
  parallel_for(p.R, [&](int64_t q) { select_one(p, q); });
}

}  // namespace dcoco::cpu
