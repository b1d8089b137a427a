// Built when CUDA is off: the module still imports and says why there is no GPU path.
#include <stdexcept>

#include "dcoco/api.h"

namespace dcoco::cuda {
bool built() { return false; }
std::string cutlass_version() { return ""; }
std::pair<int, std::string> status() { return {0, "dcoco was built without CUDA (no nvcc found or DCOCO_CUDA=OFF)"}; }
void select(const SelectParams&) { throw std::runtime_error("dcoco was built without CUDA"); }
}  // namespace dcoco::cuda
