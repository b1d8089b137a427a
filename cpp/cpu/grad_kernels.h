// The training path's dense loops (float and double), compiled per ISA like kernels.h (isa.h). Row-major
// operands with explicit leading dimensions; every sum runs in a fixed order.
#pragma once
#include <cstdint>

namespace dcoco::cpu {

// One transition's grid (K,K) and, given G = dL/dS (K,K), its gradients. pred (K,H) rows of slot p, succ
// (K,H) rows of slot p+1, u (H); scores out when non-null; du, dpred, dsucc, dw2 accumulate.
template <class T>
struct Transition {
  int64_t K, H;
  const T *u, *pred, *succ, *l_next, *w2;
  T b2;
  const T* G;
  T *scores, *du, *dpred, *dsucc, *dw2;
};

#define DCOCO_GRAD_KERNELS(T)                                                                                   \
  /* Y(M,N) = X(M,Kd) W(N,Kd)^T */                                                                             \
  void nt(int64_t M, int64_t N, int64_t Kd, const T* X, int64_t ldx, const T* W, int64_t ldw, T* Y, int64_t ldy); \
  /* Y(M,N) += X(M,Kd) W(Kd,N) */                                                                              \
  void nn(int64_t M, int64_t N, int64_t Kd, const T* X, int64_t ldx, const T* W, int64_t ldw, T* Y, int64_t ldy); \
  /* G(N,w) += D(M,N)^T X(M,w) */                                                                               \
  void tn(int64_t M, int64_t N, const T* D, int64_t ldd, const T* X, int64_t ldx, T* G, int64_t ldg, int64_t w); \
  void transition(const Transition<T>& t);
DCOCO_GRAD_KERNELS(float)
DCOCO_GRAD_KERNELS(double)
#undef DCOCO_GRAD_KERNELS

}  // namespace dcoco::cpu
