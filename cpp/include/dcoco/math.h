// The DCOCO arithmetic, written once. Every function here is __host__ __device__: the CPU path
// (cpp/cpu) and the CUDA kernels (cuda/) call the same code, so CPU tests pin the GPU's math too.
#pragma once
#include <cmath>
#include <cstdint>

#include "dcoco/host_device.h"

namespace dcoco {

constexpr float kLayerNormEps = 1e-5f;

// Keeps T out of template argument deduction (nullptr arguments then convert to const T*).
template <class T>
struct same_as_ {
  using type = T;
};
template <class T>
using same_t = typename same_as_<T>::type;

// erf as x P(x^2) / Q(x^2) on |x| <= 3.92 and +-1 beyond (where float32 erf is +-1): branch-free, so
// host loops vectorise it; max abs error 3.2e-7 (libm erff: 6e-8). Coefficients: scripts/fit_erf.py.
DCOCO_HD float erf_rational(float x) {
  const float c = x > 3.92f ? 3.92f : (x < -3.92f ? -3.92f : x);  // comparisons keep NaN
  const float t = c * c;
  const float p = ((((6.4188630e-06f * t + 4.0022298e-04f) * t + 4.1434965e-03f) * t + 5.5367231e-02f) * t +
                   1.9158922e-01f) * t + 1.1283792f;
  const float q = (((((2.3940052e-07f * t + 6.9846741e-05f) * t + 1.3895464e-03f) * t + 1.6096484e-02f) * t +
                    1.1677510e-01f) * t + 5.0312513e-01f) * t + 1.0f;
  const float e = c * p / q;
  return x > 3.92f ? 1.0f : (x < -3.92f ? -1.0f : e);
}

// Overloads per precision (unqualified host math would promote float to double).
DCOCO_HD float erf_of(float x) { return erf_rational(x); }
DCOCO_HD double erf_of(double x) { return erf(x); }  // float64 (gradcheck) keeps libm's erf
// exp(x) for x <= 0, branch-free so host loops vectorise it: x = n ln2 + t, |t| <= ln2/2, exp(t) by its
// degree-6 Taylor polynomial (relative error < 2e-7); below -87 (where exp(x) < 2^-125) it returns
// exp(-87).
DCOCO_HD float exp_nonpos(float x) {
  x = x < -87.f ? -87.f : x;
  const int n = int(nearbyintf(x * 1.44269504f));  // round(x / ln2)
  const float t = (x - float(n) * 0.693359375f) - float(n) * -2.12194440e-4f;
  const float p = 1.f + t * (1.f + t * (0.5f + t * (1.6666667e-1f + t * (4.1666668e-2f + t * (8.3333338e-3f + t * 1.3888889e-3f)))));
  return p * bits_to_float(uint32_t(n + 127) << 23);
}
DCOCO_HD double exp_nonpos(double x) { return exp(x); }
DCOCO_HD float sqrt_of(float x) { return sqrtf(x); }
DCOCO_HD double sqrt_of(double x) { return sqrt(x); }

// GELU, the erf form (nn.GELU() default, not the tanh approximation), and its derivative
//   gelu'(x) = Phi(x) + x phi(x).
template <class T>
DCOCO_HD T gelu(T x) {
  return T(0.5) * x * (T(1) + erf_of(x * T(0.70710678118654752440)));
}

template <class T>
DCOCO_HD T gelu_grad(T x) {
  return T(0.5) * (T(1) + erf_of(x * T(0.70710678118654752440))) +
         x * T(0.39894228040143267794) * exp_nonpos(T(-0.5) * x * x);
}

// LayerNorm of one row in place, biased variance, eps 1e-5; gamma/beta may be null (no affine). Returns
// 1/sigma, which the backward needs. Two passes (mean, then centred variance) to stay accurate for rows
// with a large mean.
template <class T>
DCOCO_HD T layer_norm(T* x, int n, const same_t<T>* gamma, const same_t<T>* beta) {
  T sum = 0;
  DCOCO_SIMD_SUM
  for (int i = 0; i < n; ++i) sum += x[i];
  const T mean = sum / T(n);
  sum = 0;
  DCOCO_SIMD_SUM
  for (int i = 0; i < n; ++i) sum += (x[i] - mean) * (x[i] - mean);
  const T inv = T(1) / sqrt_of(sum / T(n) + T(kLayerNormEps));
  for (int i = 0; i < n; ++i) {
    const T y = (x[i] - mean) * inv;
    x[i] = gamma ? y * gamma[i] + beta[i] : y;
  }
  return inv;
}

// The gradient through y = LN(x) (no affine) given y, 1/sigma and dL/dy:
//   dL/dx = (dy - mean(dy) - y mean(dy y)) / sigma.
template <class T>
DCOCO_HD void layer_norm_grad(const T* y, T inv, const T* dy, T* dx, int n) {
  T a = 0, b = 0;
  for (int i = 0; i < n; ++i) a += dy[i], b += dy[i] * y[i];
  a /= T(n), b /= T(n);
  for (int i = 0; i < n; ++i) dx[i] = inv * (dy[i] - a - y[i] * b);
}

// S_p(a,b) from the rank-split first MLP layer (docs/spec.md, "Exact rewrites"):
//   u = W1_s s_p + b1, a = W1_a z_pa + w_la l_p(a), b = W1_b z_{p+1,b} + w_lb l_{p+1}(b)   (each H)
//   S = l_{p+1}(b) + b2 + sum_j w2[j] gelu(u[j] + a[j] + b[j])
// transition_terms sums j in [j0, j1), so a score can be split over threads and added in a fixed order.
template <class T>
DCOCO_HD T transition_terms(const T* u, const T* a, const T* b, const T* w2, int j0, int j1) {
  T sum = 0;
  DCOCO_SIMD_SUM
  for (int j = j0; j < j1; ++j) sum += w2[j] * gelu(u[j] + a[j] + b[j]);
  return sum;
}

template <class T>
DCOCO_HD T transition_score(const T* u, const T* a, const T* b, const T* w2, int H, same_t<T> b2, same_t<T> l_next) {
  return l_next + (transition_terms(u, a, b, w2, 0, H) + b2);
}

// The slot p (global index over R B) of transition t = (request, p); B drafted slots per request.
DCOCO_HD int64_t transition_slot(int64_t t, int64_t B) { return t / (B - 1) * B + t % (B - 1); }

// The direct part of dL/dl for candidate c (an index over R B K): l_{p+1}(b) enters S_p(., b) as itself, so the
// candidate of rank b in slot p+1 gets column b of transition p's dL/dS (B drafted slots, K candidates, grad
// (R,B-1,K,K)); a request's first slot gets none. The rest of dL/dl comes through w_la and w_lb (the pred and succ
// terms), which the callers add.
template <class T>
DCOCO_HD T logit_grad_direct(const T* grad, int64_t c, int64_t B, int64_t K) {
  const int64_t slot = c / K % B, k = c % K, t = c / (K * B) * (B - 1) + slot - 1;
  T dl = 0;
  if (slot > 0)
    for (int64_t a = 0; a < K; ++a) dl += grad[(t * K + a) * K + k];
  return dl;
}

// The backward of one MLP unit j of S(a,b): with x = u_j + a_j + b_j and g = dL/dS(a,b), adds g gelu(x) to
// dL/dw2_j and returns dL/dx = g w2_j gelu'(x) (shared by u_j, pred_a and succ_b).
template <class T>
DCOCO_HD T transition_unit_grad(T u, T a, T b, T w2, T g, T* dw2) {
  const T x = u + a + b;
  *dw2 += g * gelu(x);
  return g * w2 * gelu_grad(x);
}

}  // namespace dcoco
