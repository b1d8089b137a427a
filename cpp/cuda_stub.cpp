// Built when CUDA is off: the module still imports and says why there is no GPU path.
#include <stdexcept>

#include "dcoco/api.h"

#ifndef DCOCO_CUDA_WHY  // the cause CMake found, e.g. "nvcc was not found (...)"
#define DCOCO_CUDA_WHY "no nvcc found or DCOCO_CUDA=OFF"
#endif

namespace dcoco::cuda {
bool built() { return false; }
std::string cutlass_version() { return ""; }
std::pair<int, std::string> status() { return {0, std::string("dcoco was built without CUDA: ") + DCOCO_CUDA_WHY}; }
void select(const SelectParams&) { throw std::runtime_error("dcoco was built without CUDA"); }
void forward(const ForwardParams&) { throw std::runtime_error("dcoco was built without CUDA"); }
void cand_table(const CandTableParams&) { throw std::runtime_error("dcoco was built without CUDA"); }
std::pair<int64_t, int64_t> workspace_sizes(const ForwardParams&) { return {0, 0}; }
void score_grad(const GradParams<float>&) { throw std::runtime_error("dcoco was built without CUDA"); }
int64_t grad_workspace_size(const GradParams<float>&) { return 0; }
std::string cuda_path() { throw std::runtime_error("dcoco was built without CUDA"); }
}  // namespace dcoco::cuda
