// Turns a CUDA error into the exception the bindings raise in Python, carrying CUDA's own text.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace dcoco::cuda {

inline void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(err));
}

}  // namespace dcoco::cuda
