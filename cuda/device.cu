// Device discovery; the module imports and answers on machines with no GPU or driver.
#include <cuda_runtime.h>
#include <cutlass/version.h>

#include <string>

#include "dcoco/api.h"

namespace dcoco::cuda {

bool built() { return true; }

std::string cutlass_version() {
  return std::to_string(CUTLASS_MAJOR) + "." + std::to_string(CUTLASS_MINOR) + "." + std::to_string(CUTLASS_PATCH);
}

std::pair<int, std::string> status() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls start clean
    return {0, std::string("no CUDA device: ") + cudaGetErrorString(err)};
  }
  if (n == 0) return {0, "no CUDA device"};
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  return {n, std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")"};
}

}  // namespace dcoco::cuda
