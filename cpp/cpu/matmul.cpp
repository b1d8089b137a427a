#include "matmul.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DCOCO_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DCOCO_ISA_CLONES
#endif
#define DCOCO_INLINE __attribute__((always_inline)) inline

namespace dcoco::cpu {
namespace {

// --- Y = X Wt with Wt (Kd,N) row-major (short Kd): broadcast X, rows of Wt in 32 lanes ------------

// Y(i,j) of a (MB,NB) tile, or Y(j,i) when transposed; only the first `valid` columns are stored.
template <int MB, int NB>
DCOCO_INLINE void outer_tile(Mat X, Mat Wt, int64_t Kd, float* Y, int64_t ldy, bool accumulate, bool transposed,
                             int64_t valid) {
  float acc[MB][NB] = {};
  for (int64_t k = 0; k < Kd; ++k) {
    const float* w = Wt.ptr + k * Wt.ld;
    for (int i = 0; i < MB; ++i) {
      const float x = X.ptr[i * X.ld + k];
      for (int j = 0; j < NB; ++j) acc[i][j] += x * w[j];
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB && j < valid; ++j) {
      float& y = transposed ? Y[j * ldy + i] : Y[i * ldy + j];
      y = accumulate ? y + acc[i][j] : acc[i][j];
    }
}

template <int MB>
DCOCO_INLINE void outer_rows(Mat X, Mat Wt, int64_t N, int64_t Kd, float* Y, int64_t ldy, bool accumulate,
                             bool transposed, int64_t valid) {
  auto at = [&](int64_t j) { return transposed ? Y + j * ldy : Y + j; };
  int64_t j = 0;
  for (; j + 32 <= N; j += 32) outer_tile<MB, 32>(X, {Wt.ptr + j, Wt.ld}, Kd, at(j), ldy, accumulate, transposed, valid - j);
  for (; j < N; ++j) outer_tile<MB, 1>(X, {Wt.ptr + j, Wt.ld}, Kd, at(j), ldy, accumulate, transposed, valid - j);
}

constexpr int64_t kOuterDepth = 256;  // Kd block: a (256 x 64) slice of Wt stays in L1/L2

template <bool kTransposed>
DCOCO_INLINE void outer_product(Mat X, int64_t M, Mat Wt, int64_t N, int64_t Kd, float* Y, int64_t ldy,
                                int64_t valid) {
  for (int64_t k0 = 0; k0 < Kd; k0 += kOuterDepth) {
    const int64_t kd = std::min(kOuterDepth, Kd - k0);
    const Mat Wk{Wt.ptr + k0 * Wt.ld, Wt.ld};
    const bool acc = k0 > 0;
    auto row = [&](int64_t i) { return kTransposed ? Y + i : Y + i * ldy; };
    int64_t i = 0;
    for (; i + 6 <= M; i += 6) outer_rows<6>({X.ptr + i * X.ld + k0, X.ld}, Wk, N, kd, row(i), ldy, acc, kTransposed, valid);
    for (; i < M; ++i) outer_rows<1>({X.ptr + i * X.ld + k0, X.ld}, Wk, N, kd, row(i), ldy, acc, kTransposed, valid);
  }
  if (Kd == 0)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < valid; ++j) (kTransposed ? Y[j * ldy + i] : Y[i * ldy + j]) = 0.f;
}

}  // namespace

DCOCO_ISA_CLONES void matmul_nn(Mat X, int64_t M, Mat Wt, int64_t N, int64_t Kd, float* Y, int64_t ldy) {
  outer_product<false>(X, M, Wt, N, Kd, Y, ldy, N);
}

DCOCO_ISA_CLONES void project_t(Mat Xt, int64_t M, Mat W, int64_t N, int64_t Kd, float* Y, int64_t ldy) {
  outer_product<true>(W, N, Xt, padded_lanes(M), Kd, Y, ldy, M);  // padding is computed, never stored
}

}  // namespace dcoco::cpu
