// The CPU path: the corrector's forward from the shared arithmetic (dcoco/math.h), threaded with
// OpenMP over rows, slots and requests. Rank-split first MLP layer (SPEC.md): per pair u, per
// predecessor a, per successor b; the K^2 part is adds + GELU + a dot with w2.
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dcoco/api.h"
#include "dcoco/select.h"
#include "matmul.h"

namespace dcoco::cpu {
namespace {

constexpr int64_t kRowsPerTask = 32;

template <class F>
void parallel_for(int64_t n, F&& f) {
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// Runs f(row0, rows) over [0,n) in blocks of kRowsPerTask.
template <class F>
void parallel_rows(int64_t n, F&& f) {
  parallel_for((n + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    const int64_t i = t * kRowsPerTask;
    f(i, std::min(kRowsPerTask, n - i));
  });
}

// The calling thread's workspace for one call: grows, is kept, and is never zero-filled, so the large
// per-call buffers cost no page faults or memsets on the hot path.
float* arena(int64_t n) {
  thread_local std::unique_ptr<float[]> buf;
  thread_local int64_t cap = 0;
  if (n > cap) buf.reset(new float[n]), cap = n;
  return buf.get();
}

std::vector<float>& scratch(int slot) {  // per-thread buffers, reused across calls
  thread_local std::vector<float> bufs[3];
  return bufs[slot];
}

float* scratch(int slot, int64_t n) {
  auto& v = scratch(slot);
  if (int64_t(v.size()) < n) v.resize(n);
  return v.data();
}

// xt(d, padded_lanes(n)) f32 = src[rows[i]] transposed, zero padding (rows == null: row0..row0+n-1).
void gather_rows_t(const void* src, DType t, int64_t d, const int64_t* rows, int64_t row0, int64_t n, float* xt) {
  const int64_t ld = padded_lanes(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t base = (rows ? rows[i] : row0 + i) * d;
    for (int64_t j = 0; j < d; ++j) xt[j * ld + i] = load_float(src, t, base + j);
  }
  for (int64_t j = 0; j < d; ++j)
    for (int64_t i = n; i < ld; ++i) xt[j * ld + i] = 0.f;
}

// The (rows, cols) block of W starting at column c0, transposed into a dense (cols, rows) copy.
std::vector<float> transposed(const float* W, int64_t ld, int64_t rows, int64_t c0, int64_t cols) {
  std::vector<float> t(cols * rows);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = W[i * ld + c0 + j];
  return t;
}

// out(n,r) = W_fuse[:, :r] LN(W_cand E[rows]): the candidate half of the fusion before adding W_fuse[:, r:] g.
void cand_rows(const void* embed, DType et, int64_t d, int64_t r, const float* cand_proj, const float* fuse_proj,
               const int64_t* rows, int64_t n, float* out) {
  const std::vector<float> fuse_b = transposed(fuse_proj, 2 * r, r, 0, r);
  parallel_rows(n, [&](int64_t i0, int64_t m) {
    float* xt = scratch(0, d * padded_lanes(m));
    float* b = scratch(1, m * r);
    gather_rows_t(embed, et, d, rows ? rows + i0 : nullptr, i0, m, xt);
    project_t({xt, padded_lanes(m)}, m, {cand_proj, d}, r, d, b, r);
    for (int64_t i = 0; i < m; ++i) layer_norm(b + i * r, int(r), nullptr, nullptr);
    matmul_nn({b, r}, m, {fuse_b.data(), r}, r, r, out + i0 * r, r);
  });
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

void check_shapes(const CorrectParams& p) {
  require(p.R >= 0 && p.B >= 1 && p.K >= 1 && p.d >= 1 && p.V >= 1 && p.r >= 2 && p.H >= 1,
          "dcoco: bad sizes R=" + std::to_string(p.R) + " B=" + std::to_string(p.B) + " K=" + std::to_string(p.K) +
              " d=" + std::to_string(p.d) + " V=" + std::to_string(p.V) + " r=" + std::to_string(p.r) +
              " H=" + std::to_string(p.H));
  require(p.K <= kMaxCandidates, "cand_ids: K=" + std::to_string(p.K) + " candidates per slot exceeds the compiled maximum " +
                                     std::to_string(kMaxCandidates));
  require(p.hidden && p.cand_ids && p.cand_logits && (p.embed || p.table), "dcoco: null input pointer");
  require(p.scores || (p.ranks && p.tokens), "dcoco: nothing to compute (no scores, no ranks/tokens)");
}

// cand_ids as int64, each checked against [0, V).
std::vector<int64_t> checked_ids(const CorrectParams& p) {
  const int64_t n = p.R * p.B * p.K;
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = load_id(p.cand_ids, p.ids_dtype, i);
    if (ids[i] < 0 || ids[i] >= p.V) {
      const int64_t rank = i % p.K, slot = (i / p.K) % p.B, req = i / (p.K * p.B);
      throw std::out_of_range("cand_ids[" + std::to_string(req) + ", " + std::to_string(slot) + ", " +
                              std::to_string(rank) + "] = " + std::to_string(ids[i]) + " is outside [0, V=" +
                              std::to_string(p.V) + ")");
    }
  }
  return ids;
}

}  // namespace

void correct(const CorrectParams& p) {
  check_shapes(p);
  if (p.R == 0) return;
  const int64_t R = p.R, B = p.B, K = p.K, d = p.d, r = p.r, H = p.H, in = 3 * r + 2;
  const int64_t S = R * B, C = S * K, T = R * (B - 1);  // slots, candidates, transitions (pairs)
  const Weights& w = p.w;
  const std::vector<int64_t> ids = checked_ids(p);
  const int64_t blocks = (S + kRowsPerTask - 1) / kRowsPerTask, ld = padded_lanes(std::min(S, kRowsPerTask));
  float* logit = arena(C + 4 * S * r + blocks * d * ld + C * r + C * H + T * H);
  float *g = logit + C, *gf = g + S * r, *P = gf + S * r, *Q = P + S * r, *xt = Q + S * r;
  float *z = xt + blocks * d * ld, *succ = z + C * r, *pair = succ + C * H;
  for (int64_t i = 0; i < C; ++i) logit[i] = load_float(p.cand_logits, p.logits_dtype, i);

  // Per slot (S,r): gf = W_fuse[:, r:] LN(W_ctx h), P = W_pair[:, :d] h, Q = W_pair[:, d:] h.
  // Tasks are (block of slots, one of the three d-wide weights), so R = 1 still uses every thread.
  parallel_for(blocks, [&](int64_t t) {
    const int64_t i0 = t * kRowsPerTask;
    gather_rows_t(p.hidden, p.hidden_dtype, d, nullptr, i0, std::min(kRowsPerTask, S - i0), xt + t * d * ld);
  });
  const float* mats[3] = {w.ctx_proj, w.pair_proj, w.pair_proj + d};
  float* outs[3] = {g, P, Q};
  parallel_for(3 * blocks, [&](int64_t t) {
    const int64_t blk = t / 3, i0 = blk * kRowsPerTask, m = std::min(kRowsPerTask, S - i0), which = t % 3;
    project_t({xt + blk * d * ld, ld}, m, {mats[which], which ? 2 * d : d}, r, d, outs[which] + i0 * r, r);
  });
  const std::vector<float> fuse_g = transposed(w.fuse_proj, 2 * r, r, r, r);
  parallel_rows(S, [&](int64_t i0, int64_t m) {
    for (int64_t i = i0; i < i0 + m; ++i) layer_norm(g + i * r, int(r), nullptr, nullptr);
    matmul_nn({g + i0 * r, r}, m, {fuse_g.data(), r}, r, r, gf + i0 * r, r);
  });

  // Per candidate (C,r): z = LN_gb(W_fuse [b ; g]), b from the vocabulary table when prepared.
  if (!p.table) cand_rows(p.embed, p.embed_dtype, d, r, w.cand_proj, w.fuse_proj, ids.data(), C, z);
  parallel_rows(C, [&](int64_t i0, int64_t m) {
    for (int64_t c = i0; c < i0 + m; ++c) {
      float* zc = z + c * r;
      const float* b = p.table ? p.table + ids[c] * r : zc;
      const float* gc = gf + (c / K) * r;
      for (int64_t j = 0; j < r; ++j) zc[j] = b[j] + gc[j];
      layer_norm(zc, int(r), w.fuse_gamma, w.fuse_beta);
    }
  });
  // The first MLP layer split by input block (transposed for matmul_nn), and its two logit columns.
  const std::vector<float> w1_s = transposed(w.w1, in, H, 0, r), w1_a = transposed(w.w1, in, H, r, r),
                           w1_b = transposed(w.w1, in, H, 2 * r, r), w_la = transposed(w.w1, in, H, 3 * r, 1),
                           w_lb = transposed(w.w1, in, H, 3 * r + 1, 1);

  // Successor terms (C,H): W1_b z + w_lb l.
  parallel_rows(C, [&](int64_t i0, int64_t m) {
    matmul_nn({z + i0 * r, r}, m, {w1_b.data(), H}, H, r, succ + i0 * H, H);
    for (int64_t i = i0; i < i0 + m; ++i)
      for (int64_t j = 0; j < H; ++j) succ[i * H + j] += w_lb[j] * logit[i];
  });

  // Pair terms (T,H): W1_s (P_p + Q_{p+1}) + b1.
  parallel_rows(T, [&](int64_t i0, int64_t m) {
    float* s = scratch(0, m * r);
    for (int64_t t = i0; t < i0 + m; ++t) {
      const int64_t slot = (t / (B - 1)) * B + t % (B - 1);
      for (int64_t j = 0; j < r; ++j) s[(t - i0) * r + j] = P[slot * r + j] + Q[(slot + 1) * r + j];
    }
    matmul_nn({s, r}, m, {w1_s.data(), H}, H, r, pair + i0 * H, H);
    for (int64_t i = i0; i < i0 + m; ++i)
      for (int64_t j = 0; j < H; ++j) pair[i * H + j] += w.b1[j];
  });

  // Predecessor terms of candidates (m rows from c0): W1_a z + w_la l, into out (m,H).
  auto pred_terms = [&](int64_t c0, int64_t m, float* out) {
    matmul_nn({z + c0 * r, r}, m, {w1_a.data(), H}, H, r, out, H);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < H; ++j) out[i * H + j] += w_la[j] * logit[c0 + i];
  };
  // Scores of one predecessor row: out[b] = S(a, b) for the transition t = (req, p).
  auto score_row = [&](int64_t t, const float* a_terms, float* out) {
    const int64_t next = ((t / (B - 1)) * B + t % (B - 1) + 1) * K;  // first candidate of slot p+1
    for (int64_t b = 0; b < K; ++b)
      out[b] = transition_score(pair + t * H, a_terms, succ + (next + b) * H, w.w2, int(H), w.b2[0],
                                logit[next + b]);
  };

  if (p.scores) {
    parallel_for(T, [&](int64_t t) {
      const int64_t c0 = ((t / (B - 1)) * B + t % (B - 1)) * K;
      float* a_terms = scratch(2, K * H);
      pred_terms(c0, K, a_terms);
      for (int64_t a = 0; a < K; ++a) score_row(t, a_terms + a * H, p.scores + (t * K + a) * K);
    });
  }
  if (!p.ranks) return;
  parallel_for(R, [&](int64_t q) {
    int64_t* ranks = p.ranks + q * B;
    float* a_terms = scratch(2, H + K);
    float* row = a_terms + H;
    int64_t k = argmax(logit + q * B * K, int(K));
    ranks[0] = k;
    for (int64_t s = 0; s + 1 < B; ++s) {
      const int64_t t = q * (B - 1) + s;
      const float* scores = row;
      if (p.scores) {
        scores = p.scores + (t * K + k) * K;
      } else {
        pred_terms((q * B + s) * K + k, 1, a_terms);  // greedy reads one predecessor row only
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
