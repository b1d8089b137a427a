// Small dense products for the CPU path, register-blocked so the compiler emits packed FMAs without
// reassociating float reductions; cloned per ISA (AVX-512, AVX2, baseline) and picked at load time.
#pragma once
#include <algorithm>
#include <cstdint>

namespace dcoco::cpu {

struct Mat {  // a row-major view: element (i,j) at ptr[i * ld + j]
  const float* ptr;
  int64_t ld;
};

// Y(M,N) = X(M,Kd) Wt(Kd,N), Wt a transposed weight: for short Kd (r-wide inputs), no reductions.
void matmul_nn(Mat X, int64_t M, Mat Wt, int64_t N, int64_t Kd, float* Y, int64_t ldy);

// Columns of a transposed operand Xt holding M rows: whole 32-lane tiles (padding zero-filled).
inline int64_t padded_lanes(int64_t M) { return (M + 31) / 32 * 32; }

// Y(M,N) = X(M,Kd) W(N,Kd)^T from X given transposed, Xt(Kd, padded_lanes(M)): the d-wide projections
// with W in nn.Linear layout as is (no weight transposes per call).
void project_t(Mat Xt, int64_t M, Mat W, int64_t N, int64_t Kd, float* Y, int64_t ldy);

}  // namespace dcoco::cpu
