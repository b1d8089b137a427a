#include "matmul.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DCOCO_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DCOCO_ISA_CLONES
#endif

namespace dcoco::cpu {
namespace {

// A (MB,NB) block of Y; 16 independent lanes along Kd keep every FMA packed.
template <int MB, int NB>
__attribute__((always_inline)) inline void tile(Mat X, Mat W, int64_t Kd, float* Y, int64_t ldy) {
  constexpr int L = 16;
  float acc[MB][NB][L] = {};
  int64_t k = 0;
  for (; k + L <= Kd; k += L)
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j)
        for (int l = 0; l < L; ++l) acc[i][j][l] += X.ptr[i * X.ld + k + l] * W.ptr[j * W.ld + k + l];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) {
      float s = 0.f;
      for (int l = 0; l < L; ++l) s += acc[i][j][l];
      for (int64_t t = k; t < Kd; ++t) s += X.ptr[i * X.ld + t] * W.ptr[j * W.ld + t];
      Y[i * ldy + j] = s;
    }
}

template <int MB>
__attribute__((always_inline)) inline void row_block(Mat X, Mat W, int64_t N, int64_t Kd, float* Y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 4 <= N; j += 4) tile<MB, 4>(X, {W.ptr + j * W.ld, W.ld}, Kd, Y + j, ldy);
  for (; j < N; ++j) tile<MB, 1>(X, {W.ptr + j * W.ld, W.ld}, Kd, Y + j, ldy);
}

}  // namespace

DCOCO_ISA_CLONES void matmul_nt(Mat X, int64_t M, Mat W, int64_t N, int64_t Kd, float* Y, int64_t ldy) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) row_block<4>({X.ptr + i * X.ld, X.ld}, W, N, Kd, Y + i * ldy, ldy);
  for (; i < M; ++i) row_block<1>({X.ptr + i * X.ld, X.ld}, W, N, Kd, Y + i * ldy, ldy);
}

}  // namespace dcoco::cpu
