// One plain struct per op: raw pointers, shapes, dtype codes. The only thing the entry points take.
// Layouts are row-major and contiguous (the Python layer makes them so); shapes in comments.
#pragma once
#include <cstdint>

#include "dcoco/dtype.h"

namespace dcoco {

constexpr int kMaxCandidates = 64;  // compiled maximum K (walk scratch lives in registers/smem)

// The corrector's ten weights in nn.Linear layout (out,in), one pointer each, in the order Python passes them:
// P is const T* for the weights (float32 for inference, T for training) and T* for their gradients.
template <class P>
struct WeightPtrs {
  P cand_proj = nullptr;   // (r,d)    W_cand
  P ctx_proj = nullptr;    // (r,d)    W_ctx
  P fuse_proj = nullptr;   // (r,2r)   W_fuse, input [b ; g]
  P fuse_gamma = nullptr;  // (r)
  P fuse_beta = nullptr;   // (r)
  P pair_proj = nullptr;   // (r,2d)   W_pair, input [h_p ; h_{p+1}]
  P w1 = nullptr;          // (H,3r+2) input [s ; z_a ; z_b ; l_a ; l_b]
  P b1 = nullptr;          // (H)
  P w2 = nullptr;          // (H)
  P b2 = nullptr;          // (1)
};
template <class T>
using WeightsOf = WeightPtrs<const T*>;
template <class T>
using WeightGradsOf = WeightPtrs<T*>;
using Weights = WeightsOf<float>;

// Score and/or walk one batch of drafted blocks.
struct ForwardParams {
  int64_t R = 0, B = 0, K = 0;  // requests, drafted slots, candidates per slot
  int64_t d = 0, V = 0;         // hidden width, vocabulary rows
  int64_t r = 0, H = 0;         // corrector width, MLP hidden
  const void* hidden = nullptr;       // (R,B,d)  f32 | bf16 | f16
  DType hidden_dtype = DType::f32;
  const void* cand_ids = nullptr;     // (R,B,K)  i32 | i64, rank 0 = argmax
  DType ids_dtype = DType::i64;
  const void* cand_logits = nullptr;  // (R,B,K)  f32 | bf16 | f16
  DType logits_dtype = DType::f32;
  const void* embed = nullptr;        // (V,d)    f32 | bf16 | f16, frozen
  DType embed_dtype = DType::f32;
  const float* table = nullptr;       // (V,r)    optional W_fuse[:, :r] LN(W_cand E[v]) (CandTableParams)
  Weights w;
  float* scores = nullptr;   // (R,B-1,K,K) out, optional: S[r,p,a,b] = S_{p+1}(a,b)
  int64_t* ranks = nullptr;  // (R,B) out, optional: the greedy walk
  int64_t* tokens = nullptr; // (R,B) out, with ranks: cand_ids gathered at ranks
  // CUDA only: a float workspace and zeroed int32 counters of cuda::workspace_sizes(*this), both torch
  // allocations, and the stream to launch on.
  float* workspace = nullptr;
  int32_t* counters = nullptr;
  void* stream = nullptr;
};

// Training: the score grid recomputed with its intermediates and, given dL/dscores, the gradients of
// hidden, cand_logits and every weight (none for embed, frozen, or the ids). T = float, or double for
// gradcheck. Gradient outputs are overwritten, in T, shaped like their inputs.
template <class T>
struct GradParams {
  int64_t R = 0, B = 0, K = 0, d = 0, V = 0, r = 0, H = 0;
  const void* hidden = nullptr;       // (R,B,d)  f32 | bf16 | f16 | f64
  DType hidden_dtype = DType::f32;
  const void* cand_ids = nullptr;     // (R,B,K)  i32 | i64
  DType ids_dtype = DType::i64;
  const void* cand_logits = nullptr;  // (R,B,K)
  DType logits_dtype = DType::f32;
  const void* embed = nullptr;        // (V,d)
  DType embed_dtype = DType::f32;
  WeightsOf<T> w;
  const T* grad = nullptr;   // (R,B-1,K,K) dL/dscores; null: no gradients
  T* scores = nullptr;       // (R,B-1,K,K) out, optional
  T* d_hidden = nullptr;     // (R,B,d) out, with grad
  T* d_logits = nullptr;     // (R,B,K) out, with grad
  WeightGradsOf<T> d_w;      // out, with grad
  // CUDA only (float): a float workspace of cuda::grad_workspace_size(*this), a torch allocation, and the
  // stream to launch on.
  T* workspace = nullptr;
  void* stream = nullptr;
};

// The inference table T[v] = W_fuse[:, :r] LN(W_cand E[v]) for every vocabulary row.
struct CandTableParams {
  int64_t V = 0, d = 0, r = 0;
  const void* embed = nullptr;  // (V,d)
  DType embed_dtype = DType::f32;
  const float* cand_proj = nullptr;  // (r,d)
  const float* fuse_proj = nullptr;  // (r,2r)
  float* table = nullptr;            // (V,r) out
  void* stream = nullptr;            // CUDA only
};

// Path selection on a given score grid.
enum class Rule : int32_t { greedy = 0, global = 1, geometric = 2 };

struct SelectParams {
  int64_t R = 0, B = 0, K = 0;
  const float* scores = nullptr;  // (R,B-1,K,K)
  const void* first_logits = nullptr;  // (R,K) slot-1 logits
  DType first_dtype = DType::f32;
  Rule rule = Rule::greedy;
  float lam = 0.75f;  // geometric only
  float* work = nullptr;      // (R,3K) scratch: slot-1 logits as f32, then two rows of suffix values
  int32_t* next = nullptr;    // (R,B-1,K) scratch: best successor of each node (global, geometric)
  int64_t* ranks = nullptr;   // (R,B) out
  void* stream = nullptr;     // cudaStream_t on the CUDA path
};

}  // namespace dcoco
