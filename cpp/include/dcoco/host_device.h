// What the shared headers need to compile for both sides: every function of dcoco/math.h, dtype.h and walk.h is
// DCOCO_HD, so the CPU path (cpp/cpu) and the CUDA kernels (cuda/) run the same code.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DCOCO_HD __host__ __device__ __forceinline__
#else
#define DCOCO_HD inline __attribute__((always_inline))
#endif

// Host loops may sum in SIMD lanes (a different but equally exact-to-tolerance order than one thread).
#if !defined(__CUDA_ARCH__) && defined(_OPENMP)
#define DCOCO_SIMD_SUM _Pragma("omp simd reduction(+ : sum)")
#else
#define DCOCO_SIMD_SUM
#endif

namespace dcoco {

DCOCO_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);  // unlike memcpy, keeps host loops vectorisable
#endif
}

}  // namespace dcoco
