#include "kernels.h"

#include "dcoco/math.h"
#include "isa.h"

namespace dcoco::cpu {
namespace {

constexpr int64_t kDepth = 256;  // Kd block: a (256, kLanes) slice of Xt stays in L1

// (MB, kLanes) outputs: MB weight rows broadcast against kLanes activation columns, accumulated over
// Kd; stored transposed (Y row = activation) for the first `valid` columns.
template <int MB>
DCOCO_INLINE void tile(Mat W, Mat Xt, int64_t Kd, float* Y, int64_t ldy, int64_t valid, bool accumulate) {
  float acc[MB][kLanes] = {};
  for (int64_t k = 0; k < Kd; ++k) {
    const float* x = Xt.ptr + k * Xt.ld;
    for (int i = 0; i < MB; ++i) {
      const float w = W.ptr[i * W.ld + k];
      for (int j = 0; j < kLanes; ++j) acc[i][j] += w * x[j];
    }
  }
  for (int j = 0; j < valid; ++j)
    for (int i = 0; i < MB; ++i) Y[j * ldy + i] = accumulate ? Y[j * ldy + i] + acc[i][j] : acc[i][j];
}

// Weight rows per tile: the (MB, kLanes) float accumulators take 16 zmm of 32 (VB=64) or 12 ymm of 16 (VB=32),
// leaving room for the activation row and the broadcast weight.
template <int VB>
constexpr int kProjectRows = VB == 64 ? 8 : VB == 32 ? 3 : 1;

template <int VB>
DCOCO_INLINE void project_body(Mat Xt, int64_t M, Mat W, int64_t N, int64_t Kd, float* Y, int64_t ldy) {
  constexpr int MB = kProjectRows<VB>;
  for (int64_t k0 = 0; k0 < Kd; k0 += kDepth) {
    const int64_t kd = std::min(kDepth, Kd - k0);
    const Mat Xk{Xt.ptr + k0 * Xt.ld, Xt.ld};
    int64_t i = 0;
    for (; i + MB <= N; i += MB) tile<MB>({W.ptr + i * W.ld + k0, W.ld}, Xk, kd, Y + i, ldy, M, k0 > 0);
    for (; i < N; ++i) tile<1>({W.ptr + i * W.ld + k0, W.ld}, Xk, kd, Y + i, ldy, M, k0 > 0);
  }
}

}  // namespace

DCOCO_DISPATCH_VB(project_t, project_body, (Mat Xt, int64_t M, Mat W, int64_t N, int64_t Kd, float* Y, int64_t ldy),
                  (Xt, M, W, N, Kd, Y, ldy))

DCOCO_ISA_CLONES void matvec(Mat W, int64_t N, int64_t Kd, const float* x, float* y) {
  for (int64_t i = 0; i < N; ++i) {
    const float* w = W.ptr + i * W.ld;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < Kd; ++k) sum += w[k] * x[k];
    y[i] = sum;
  }
}

DCOCO_ISA_CLONES void score_row(const float* u, const float* a, const float* succ, const float* w2, int H, float b2,
                                const float* l_next, int K, float* out) {
  for (int b = 0; b < K; ++b) out[b] = transition_score(u, a, succ + int64_t(b) * H, w2, H, b2, l_next[b]);
}

void to_lanes(Mat X, int64_t M, int64_t Kd, float* Xt) {
  for (int64_t k = 0; k < Kd; ++k) {
    for (int64_t j = 0; j < M; ++j) Xt[k * kLanes + j] = X.ptr[j * X.ld + k];
    for (int64_t j = M; j < kLanes; ++j) Xt[k * kLanes + j] = 0.f;
  }
}

namespace {

// gather_lanes with the element loader fixed (the dtype is dispatched once, outside the loops).
template <class Load>
void gather_lanes_as(Load load, int64_t d, const int64_t* rows, int64_t row0, int64_t m, int64_t k0, int64_t k1,
                     float* xt) {
  int64_t base[kLanes];
  for (int64_t j = 0; j < m; ++j) base[j] = (rows ? rows[j] : row0 + j) * d;
  for (int64_t k = k0; k < k1; ++k) {  // contiguous 128-byte writes; m row streams read in step
    float* out = xt + (k - k0) * kLanes;
    for (int64_t j = 0; j < m; ++j) out[j] = load(base[j] + k);
    std::fill(out + m, out + kLanes, 0.f);
  }
}

}  // namespace

void gather_lanes(const void* src, DType t, int64_t d, const int64_t* rows, int64_t row0, int64_t m, float* xt,
                  int64_t k0, int64_t k1) {
  if (k1 < 0) k1 = d;
  const auto* h = static_cast<const uint16_t*>(src);
  if (t == DType::bf16)
    gather_lanes_as([h](int64_t i) { return bf16_to_float(h[i]); }, d, rows, row0, m, k0, k1, xt);
  else if (t == DType::f16)
    gather_lanes_as([h](int64_t i) { return f16_to_float(h[i]); }, d, rows, row0, m, k0, k1, xt);
  else
    gather_lanes_as([src](int64_t i) { return static_cast<const float*>(src)[i]; }, d, rows, row0, m, k0, k1, xt);
}

}  // namespace dcoco::cpu
