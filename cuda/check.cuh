// Turns a CUDA error into the exception the bindings raise in Python, carrying CUDA's own text.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

// kernel<<<grid, block, smem, stream>>>(args...) written DCOCO_LAUNCH(kernel, grid, block, smem, stream)(args...), so
// that tests/emulate runs these same launchers on the CPU (it defines the macro first).
#ifndef DCOCO_LAUNCH
#define DCOCO_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#endif

namespace dcoco::cuda {

inline void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(err));
}

}  // namespace dcoco::cuda
