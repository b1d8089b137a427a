// The harness of the tensor-core policy unit programs (unit_sm80.cpp, unit_sm90.cpp): a policy Mma driven through
// the real mainloop (tile_gemm, cuda/mainloop.cuh) in one emulated block of kThreads, its storage in dynamic shared
// memory, against a float64 product of the policy's 16-bit planes. Include after cuda_emulation.h, tensor_cores.h
// and the policy's header.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace unit {

using namespace dcoco::cuda;

struct Problem {
  int K;
  std::vector<float> a, b;  // (kBM,K), (kBN,K) row-major
};

inline Problem make_problem(int K, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd;
  Problem p{K, std::vector<float>(size_t(kBM) * K), std::vector<float>(size_t(kBN) * K)};
  for (float& x : p.a) x = nd(gen);
  for (float& x : p.b) x = nd(gen);
  return p;
}

// acc (kBM,kBN) of Mma over the whole K, one block of kThreads, storage in dynamic shared memory
// (at byte `offset` of it: the kernel's carve-outs are 1024-aligned)
template <class Mma>
std::vector<float> run(const Problem& p, size_t offset = 0) {
  std::vector<float> out(size_t(kBM) * kBN, std::nanf(""));
  emu::launch(dim3(1), dim3(kThreads), offset + sizeof(typename Mma::Storage), [&] {
    DCOCO_DYNAMIC_SMEM(smem);
    auto& st = *reinterpret_cast<typename Mma::Storage*>(smem + offset);
    typename Mma::Acc acc;
    auto la = [&](int m, int64_t k) { return p.a[size_t(m) * p.K + k]; };
    auto lb = [&](int n, int64_t k) { return p.b[size_t(n) * p.K + k]; };
    tile_gemm<Mma>(st, acc, la, lb, 0, p.K);
    Mma::store(acc, [&](int m, int n, float v) { out[size_t(m) * kBN + n] = v; });
    Mma::end(st, acc);
  }, 1);
  return out;
}

// sum_k of the policy's plane products, in float64: A_hi B_hi + A_hi B_lo (+ A_lo B_hi with two A planes)
template <class Elem>
std::vector<double> reference(const Problem& p, int a_planes, double* scale) {
  auto hi = [](float x) { return float(Elem(x)); };
  auto lo = [&](float x) { return float(Elem(x - hi(x))); };
  std::vector<double> ref(size_t(kBM) * kBN);
  *scale = 0;
  for (int m = 0; m < kBM; ++m)
    for (int n = 0; n < kBN; ++n) {
      double s = 0, mag = 0;
      for (int k = 0; k < p.K; ++k) {
        const float a = p.a[size_t(m) * p.K + k], b = p.b[size_t(n) * p.K + k];
        double t = double(hi(a)) * hi(b) + double(hi(a)) * lo(b);
        if (a_planes == 2) t += double(lo(a)) * hi(b);
        s += t, mag += std::fabs(double(a) * b);
      }
      ref[size_t(m) * kBN + n] = s;
      *scale = std::max(*scale, mag);
    }
  return ref;
}

inline double max_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i)
    e = std::max(e, std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) : INFINITY);  // NaN: a value never stored
  return e;
}

inline int failures = 0;
inline int violations = 0;  // protocol errors the emulation reported (where a unit program records them)

// positive: within tol * scale of the plane reference (fp32 accumulation of K exact products), no violation
template <class Mma, class Elem>
void expect_match(const char* name, const Problem& p, int a_planes) {
  double scale;
  const auto ref = reference<Elem>(p, a_planes, &scale);
  const int v0 = violations;
  const double err = max_err(run<Mma>(p), ref), tol = 2e-6 * scale;
  const bool ok = err <= tol && violations == v0;
  failures += !ok;
  std::printf("%-4s %-62s max |err| %.3g (tolerance %.3g)%s\n", ok ? "ok" : "FAIL", name, err, tol,
              violations == v0 ? "" : ", protocol violation reported");
}

// negative: a wrong layout must be caught, i.e. give an error far above the tolerance
template <class Mma, class Elem>
void expect_mismatch(const char* name, const Problem& p, int a_planes) {
  double scale;
  const auto ref = reference<Elem>(p, a_planes, &scale);
  const double err = max_err(run<Mma>(p), ref), tol = 2e-6 * scale;
  const bool ok = err > 1000 * tol;
  failures += !ok;
  std::printf("%-4s %-62s max |err| %.3g (must exceed %.3g)\n", ok ? "ok" : "FAIL", name, err, 1000 * tol);
}

// negative: a protocol error (a missing fence, ...) that the emulation must report
template <class Mma>
void expect_violation(const char* name, const Problem& p, size_t offset = 0) {
  const int v0 = violations;
  (void)run<Mma>(p, offset);
  const bool ok = violations > v0;
  failures += !ok;
  std::printf("%-4s %-62s %d violation(s) reported (must be > 0)\n", ok ? "ok" : "FAIL", name, violations - v0);
}

}  // namespace unit
