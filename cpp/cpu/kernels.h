// The CPU path's hot loops, compiled per ISA (x86-64-v4, x86-64-v3, baseline: isa.h) and picked at load
// time: small dense products, register-blocked (tiles sized per vector width) so the compiler emits packed
// FMAs without reassociating float reductions (weights stay in nn.Linear layout (N,Kd); the activation
// operand is given transposed),
// and the row scorer built on the shared transition_score.
#pragma once
#include <algorithm>
#include <cstdint>

#include "dcoco/dtype.h"
#include "dcoco/math.h"

namespace dcoco::cpu {

struct Mat {  // a row-major view: element (i,j) at ptr[i * ld + j]
  const float* ptr;
  int64_t ld;
};

constexpr int64_t kLanes = 32;  // columns of a transposed activation block (one register tile wide)

// Y(M,N) = X(M,Kd) W(N,Kd)^T with X given transposed as a lane block Xt(Kd, kLanes), M <= kLanes,
// columns M..kLanes-1 zero, Kd >= 1. Y rows at stride ldy.
void project_t(Mat Xt, int64_t M, Mat W, int64_t N, int64_t Kd, float* Y, int64_t ldy);

// y(N) = W(N,Kd) x(Kd): one row, for the walk's single predecessor.
void matvec(Mat W, int64_t N, int64_t Kd, const float* x, float* y);

// out[b] = transition_score(u, a, succ[b], ...) for b < K, succ rows at stride H, l_next (K) their logits.
void score_row(const float* u, const float* a, const float* succ, const float* w2, int H, float b2,
               const float* l_next, int K, float* out);

// xt(k1-k0, kLanes) = columns k0..k1 (k1 < 0: d) of m <= kLanes rows of src (dtype t, rows d wide; row
// indices `rows`, or row0..row0+m-1 when null) as float, transposed, zero padded: project_t's operand.
void gather_lanes(const void* src, DType t, int64_t d, const int64_t* rows, int64_t row0, int64_t m, float* xt,
                  int64_t k0 = 0, int64_t k1 = -1);

// Writes rows X(M,Kd) (M <= kLanes) as the lane block Xt(Kd, kLanes), zero padded.
void to_lanes(Mat X, int64_t M, int64_t Kd, float* Xt);

}  // namespace dcoco::cpu
