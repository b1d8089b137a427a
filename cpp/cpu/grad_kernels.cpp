#include "grad_kernels.h"

#include <cstring>

#include "dcoco/math.h"
#include "isa.h"

// Vector-extension values never cross a call boundary here (everything inlines), so the ABI note is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace dcoco::cpu {
namespace {

// A VB-byte vector of T (GCC vector extension: the register tiles below stay in registers; the compiler
// lowers them per ISA).
template <class T, int VB>
struct Vec {
  typedef T type __attribute__((vector_size(VB)));
  static constexpr int64_t lanes = VB / sizeof(T);
  DCOCO_INLINE static type load(const T* p) {
    type v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
};

// sum of a vector's lanes in lane order (deterministic)
template <class T, int VB>
DCOCO_INLINE T lane_sum(typename Vec<T, VB>::type v) {
  T s = 0;
  for (int64_t i = 0; i < Vec<T, VB>::lanes; ++i) s += v[i];
  return s;
}

// Register tiles per vector width: 16 zmm (VB=64) or 16 ymm/xmm (VB=32/16) registers hold the
// accumulators plus the operands of one step.
template <int VB>
constexpr int kNtRows = VB == 64 ? 4 : VB == 32 ? 3 : 2;  // nt: kNtRows x 4 dot products

// (kNtRows rows of X) x (4 rows of W): dot products over Kd, each a vector of partial sums plus a scalar
// tail; added to Y or stored.
template <int VB, class T>
DCOCO_INLINE void nt_tile(int64_t Kd, const T* X, int64_t ldx, const T* W, int64_t ldw, T* Y, int64_t ldy, bool add) {
  using V = typename Vec<T, VB>::type;
  constexpr int64_t L = Vec<T, VB>::lanes, I = kNtRows<VB>;
  V acc[I][4] = {};
  int64_t k = 0;
  for (; k + L <= Kd; k += L) {
    V x[I];
    for (int i = 0; i < I; ++i) x[i] = Vec<T, VB>::load(X + i * ldx + k);
    for (int j = 0; j < 4; ++j) {  // one W vector live at a time: I x 4 accumulators + I + 1 registers
      const V w = Vec<T, VB>::load(W + j * ldw + k);
      for (int i = 0; i < I; ++i) acc[i][j] += x[i] * w;
    }
  }
  for (int i = 0; i < I; ++i)
    for (int j = 0; j < 4; ++j) {
      T s = lane_sum<T, VB>(acc[i][j]);
      for (int64_t t = k; t < Kd; ++t) s += X[i * ldx + t] * W[j * ldw + t];
      Y[i * ldy + j] = add ? Y[i * ldy + j] + s : s;
    }
}

// Kd is taken in slices of kDepth so that a slice of W (N, kDepth) stays in L2 while every row of X passes.
constexpr int64_t kDepth = 256;

template <int VB, class T>
DCOCO_INLINE void nt_body(int64_t M, int64_t N, int64_t Kd, const T* X, int64_t ldx, const T* W, int64_t ldw, T* Y,
                          int64_t ldy) {
  constexpr int64_t I = kNtRows<VB>;
  const int64_t MI = M / I * I, N4 = N / 4 * 4;
  for (int64_t k0 = 0; k0 < Kd; k0 += kDepth) {
    const int64_t kd = Kd - k0 < kDepth ? Kd - k0 : kDepth;
    for (int64_t m = 0; m < MI; m += I)
      for (int64_t n = 0; n < N4; n += 4)
        nt_tile<VB>(kd, X + m * ldx + k0, ldx, W + n * ldw + k0, ldw, Y + m * ldy + n, ldy, k0 > 0);
  }
  for (int64_t m = 0; m < M; ++m)  // the edges
    for (int64_t n = m < MI ? N4 : 0; n < N; ++n) {
      const T *x = X + m * ldx, *w = W + n * ldw;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < Kd; ++k) s += x[k] * w[k];
      Y[m * ldy + n] = s;
    }
}

// Y(4 rows, 2 vectors of columns) += X(4 rows, Kd) W(Kd, those columns): the Y tile stays in registers
// over Kd.
template <int VB, class T>
DCOCO_INLINE void nn_tile(int64_t Kd, const T* X, int64_t ldx, const T* W, int64_t ldw, T* Y, int64_t ldy) {
  using V = typename Vec<T, VB>::type;
  constexpr int64_t L = Vec<T, VB>::lanes;
  V acc[4][2];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) acc[i][j] = Vec<T, VB>::load(Y + i * ldy + j * L);
  for (int64_t k = 0; k < Kd; ++k) {
    V w[2];
    for (int j = 0; j < 2; ++j) w[j] = Vec<T, VB>::load(W + k * ldw + j * L);
    for (int i = 0; i < 4; ++i) {
      const T a = X[i * ldx + k];
      for (int j = 0; j < 2; ++j) acc[i][j] += a * w[j];
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) std::memcpy(Y + i * ldy + j * L, &acc[i][j], sizeof(V));
}

template <int VB, class T>
DCOCO_INLINE void nn_body(int64_t M, int64_t N, int64_t Kd, const T* X, int64_t ldx, const T* W, int64_t ldw, T* Y,
                          int64_t ldy) {
  constexpr int64_t C = 2 * Vec<T, VB>::lanes;  // columns per tile
  const int64_t M4 = M / 4 * 4, NC = N / C * C;
  for (int64_t m = 0; m < M4; m += 4)
    for (int64_t n = 0; n < NC; n += C) nn_tile<VB>(Kd, X + m * ldx, ldx, W + n, ldw, Y + m * ldy + n, ldy);
  for (int64_t m = 0; m < M; ++m) {  // the edges
    T* y = Y + m * ldy;
    for (int64_t k = 0; k < Kd; ++k) {
      const T a = X[m * ldx + k];
      const T* w = W + k * ldw;
#pragma omp simd
      for (int64_t n = m < M4 ? NC : 0; n < N; ++n) y[n] += a * w[n];
    }
  }
}

// Four rows of G times J vectors of columns accumulate in registers over all M rows; G is updated once.
template <int VB>
constexpr int64_t kTnVectors = VB == 64 ? 4 : 2;

template <int VB, class T>
DCOCO_INLINE void tn_tile(int64_t M, const T* D, int64_t ldd, const T* X, int64_t ldx, T* G, int64_t ldg) {
  using V = typename Vec<T, VB>::type;
  constexpr int64_t J = kTnVectors<VB>, L = Vec<T, VB>::lanes;
  V acc[4][J] = {};
  for (int64_t m = 0; m < M; ++m) {
    V x[J];
    for (int j = 0; j < J; ++j) x[j] = Vec<T, VB>::load(X + m * ldx + j * L);
    for (int i = 0; i < 4; ++i) {
      const T a = D[m * ldd + i];
      for (int j = 0; j < J; ++j) acc[i][j] += a * x[j];
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < J; ++j)
      for (int64_t t = 0; t < L; ++t) G[i * ldg + j * L + t] += acc[i][j][t];
}

template <int VB, class T>
DCOCO_INLINE void tn_body(int64_t M, int64_t N, const T* D, int64_t ldd, const T* X, int64_t ldx, T* G, int64_t ldg,
                          int64_t w) {
  constexpr int64_t C = kTnVectors<VB> * Vec<T, VB>::lanes;  // columns per tile
  const int64_t N4 = N / 4 * 4, WC = w / C * C;
  for (int64_t n = 0; n < N4; n += 4)
    for (int64_t c = 0; c < WC; c += C) tn_tile<VB>(M, D + n, ldd, X + c, ldx, G + n * ldg + c, ldg);
  for (int64_t n = 0; n < N; ++n)  // the edges
    for (int64_t m = 0; m < M; ++m) {
      const T a = D[m * ldd + n];
#pragma omp simd
      for (int64_t k = n < N4 ? WC : 0; k < w; ++k) G[n * ldg + k] += a * X[m * ldx + k];
    }
}

template <class T>
DCOCO_INLINE void transition_body(const Transition<T>& t) {
  const int64_t K = t.K, H = t.H;
  for (int64_t a = 0; a < K; ++a)
    for (int64_t b = 0; b < K; ++b) {
      const T *u = t.u, *pa = t.pred + a * H, *sb = t.succ + b * H, *w2 = t.w2;
      if (t.scores) t.scores[a * K + b] = transition_score(u, pa, sb, w2, int(H), t.b2, t.l_next[b]);
      if (!t.G) continue;
      const T g = t.G[a * K + b];
      T *du = t.du, *da = t.dpred + a * H, *db = t.dsucc + b * H, *dw2 = t.dw2;
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) {
        const T dx = transition_unit_grad(u[j], pa[j], sb[j], w2[j], g, dw2 + j);
        du[j] += dx, da[j] += dx, db[j] += dx;
      }
    }
}

}  // namespace

#define DCOCO_GRAD_KERNELS(T)                                                                                   \
  DCOCO_DISPATCH_VB(nt, nt_body,                                                                                \
                    (int64_t M, int64_t N, int64_t Kd, const T* X, int64_t ldx, const T* W, int64_t ldw, T* Y,   \
                     int64_t ldy),                                                                              \
                    (M, N, Kd, X, ldx, W, ldw, Y, ldy))                                                         \
  DCOCO_DISPATCH_VB(nn, nn_body,                                                                                \
                    (int64_t M, int64_t N, int64_t Kd, const T* X, int64_t ldx, const T* W, int64_t ldw, T* Y,   \
                     int64_t ldy),                                                                              \
                    (M, N, Kd, X, ldx, W, ldw, Y, ldy))                                                         \
  DCOCO_DISPATCH_VB(tn, tn_body,                                                                                \
                    (int64_t M, int64_t N, const T* D, int64_t ldd, const T* X, int64_t ldx, T* G, int64_t ldg,  \
                     int64_t w),                                                                                \
                    (M, N, D, ldd, X, ldx, G, ldg, w))                                                          \
  DCOCO_ISA_CLONES void transition(const Transition<T>& t) { transition_body(t); }
DCOCO_GRAD_KERNELS(float)
DCOCO_GRAD_KERNELS(double)

}  // namespace dcoco::cpu
