// The GEMM mainloop shared by stages 1 and 2 and every MMA policy: acc (kBM,kBN) += A (kBM,K) B (kBN,K)^T
// over k in [k0, k1). The problem's loaders la(m,k), lb(n,k) return floats (zero outside the problem); each
// k-block goes global -> registers -> the policy's shared storage (converted or split there), and the
// next block's loads are issued before this block's MMAs so they overlap.
//
// An MMA policy provides: Storage (shared), Acc (the accumulators' handle), begin(st,acc) (zeroed
// accumulators), put_a(st,m,k,x), put_b(st,n,k,x), publish() (after a thread's stores, before the barrier),
// mma(st,acc), store(acc,f) calling f(m,n,value) for every element the thread owns, and end(st,acc).
#pragma once
#include "plan.cuh"

namespace dcoco::cuda {

template <class Mma, class LoadA, class LoadB>
__device__ void tile_gemm(typename Mma::Storage& st, typename Mma::Acc& acc, LoadA la, LoadB lb, int64_t k0,
                          int64_t k1) {
  constexpr int kRows = kThreads / kBK, kA = kBM / kRows, kB = kBN / kRows;
  const int kk = threadIdx.x % kBK, row = threadIdx.x / kBK;  // a warp reads one row's kBK columns
  float ra[kA], rb[kB];
  auto fetch = [&](int64_t k) {
    const bool in = k + kk < k1;
    for (int i = 0; i < kA; ++i) ra[i] = in ? la(row + i * kRows, k + kk) : 0.f;
    for (int i = 0; i < kB; ++i) rb[i] = in ? lb(row + i * kRows, k + kk) : 0.f;
  };
  Mma::begin(st, acc);
  if (k0 >= k1) return;
  fetch(k0);
  for (int64_t k = k0; k < k1; k += kBK) {
    __syncthreads();  // the previous block's MMAs are done reading the storage
    for (int i = 0; i < kA; ++i) Mma::put_a(st, row + i * kRows, kk, ra[i]);
    for (int i = 0; i < kB; ++i) Mma::put_b(st, row + i * kRows, kk, rb[i]);
    Mma::publish();
    __syncthreads();
    if (k + kBK < k1) fetch(k + kBK);
    Mma::mma(st, acc);
  }
}

// fp32 FMA on CUDA cores: exact float32 products, for float32 inputs and GPUs without a tensor-core path
// (and the CPU emulation of the kernel). A thread owns 4 rows x 8 columns (strided by 16: no bank conflicts).
struct SimtMma {
  struct Storage {
    float a[kBK][kBM + 4];
    float b[kBK][kBN + 4];
  };
  struct Acc {
    float c[4][8];
  };
  __device__ static void begin(Storage&, Acc& acc) {
    for (auto& row : acc.c)
      for (float& v : row) v = 0.f;
  }
  __device__ static void end(Storage&, Acc&) {}
  __device__ static void put_a(Storage& st, int m, int k, float x) { st.a[k][m] = x; }
  __device__ static void put_b(Storage& st, int n, int k, float x) { st.b[k][n] = x; }
  __device__ static void publish() {}
  __device__ static void mma(const Storage& st, Acc& acc) {
    const int m0 = threadIdx.x / 16 * 4, n0 = threadIdx.x % 16;
    for (int k = 0; k < kBK; ++k) {
      float a[4], b[8];
      for (int i = 0; i < 4; ++i) a[i] = st.a[k][m0 + i];
      for (int j = 0; j < 8; ++j) b[j] = st.b[k][n0 + 16 * j];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 8; ++j) acc.c[i][j] = fmaf(a[i], b[j], acc.c[i][j]);
    }
  }
  template <class F>
  __device__ static void store(const Acc& acc, F&& f) {
    const int m0 = threadIdx.x / 16 * 4, n0 = threadIdx.x % 16;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 8; ++j) f(m0 + i, n0 + 16 * j, acc.c[i][j]);
  }
};
static_assert(sizeof(SimtMma::Storage) <= kMmaSmem);

}  // namespace dcoco::cuda
