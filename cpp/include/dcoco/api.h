// Entry points of the compiled core. Torch-free: params structs in, results written through their
// pointers. Bad input throws std::invalid_argument / std::out_of_range with a message naming the
// argument (the binding turns them into ValueError / IndexError).
#pragma once
#include <string>
#include <utility>

#include "dcoco/params.h"

namespace dcoco {

namespace cpu {
void forward(const ForwardParams& p);
void cand_table(const CandTableParams& p);
void select(const SelectParams& p);
void score_grad(const GradParams<float>& p);
void score_grad(const GradParams<double>& p);
}  // namespace cpu

namespace cuda {
bool built();
std::string cutlass_version();  // the CUTLASS headers compiled against, "" without CUDA
// Launches on p.stream; each throws std::runtime_error carrying the CUDA error text.
void select(const SelectParams& p);
void forward(const ForwardParams& p);  // one launch for the whole batch
void cand_table(const CandTableParams& p);
std::pair<int64_t, int64_t> workspace_sizes(const ForwardParams& p);  // (workspace floats, counter ints)
void score_grad(const GradParams<float>& p);            // a few launches, no host sync
int64_t grad_workspace_size(const GradParams<float>& p);  // floats
// (device count, message); never throws, also without a driver.
std::pair<int, std::string> status();
// The fused kernel's arch path on the current device (dcoco/dispatch.h); throws when no built code runs there.
std::string cuda_path();
}  // namespace cuda

}  // namespace dcoco
