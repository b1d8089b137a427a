// Runs the CUDA backward (cuda/score_grad.cuh) through its real host launcher (cuda/grad.cu) under
// tests/emulate/cuda_emulation.h on inputs written by tests/ops/test_cuda_emulated.py (inputs.h plus grad.bin);
// writes the gradients there. Exit 8: a CUDA error or a refused argument.
#include "cuda_emulation.h"
// the emulation header must come first: it defines the CUDA keywords the kernels use
#include "grad.cu"

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "inputs.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  dcoco::GradParams<float> p;
  Inputs in(dir, p);
  const auto grad = read_file(dir + "/grad.bin");
  p.grad = reinterpret_cast<const float*>(grad.data());
  const float nan = __int_as_float(0x7fc00000);  // outputs and workspace poisoned
  const int64_t S = p.R * p.B, r = p.r, H = p.H, d = p.d;
  std::vector<float> d_hidden(S * d, nan), d_logits(S * p.K, nan);
  const int64_t wsize[10] = {r * d, r * d, 2 * r * r, r, r, 2 * r * d, H * (3 * r + 2), H, H, 1};
  std::vector<std::vector<float>> d_w;
  for (int i = 0; i < 10; ++i) d_w.emplace_back(wsize[i], nan);
  p.d_w = {d_w[0].data(), d_w[1].data(), d_w[2].data(), d_w[3].data(), d_w[4].data(),
           d_w[5].data(), d_w[6].data(), d_w[7].data(), d_w[8].data(), d_w[9].data()};  // in WeightPtrs order
  p.d_hidden = d_hidden.data(), p.d_logits = d_logits.data();
  std::vector<float> workspace(dcoco::cuda::grad_workspace_size(p), nan);
  p.workspace = workspace.data();
  try {
    dcoco::cuda::score_grad(p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 8;
  }
  write_file(dir + "/d_hidden.bin", d_hidden.data(), d_hidden.size());
  write_file(dir + "/d_logits.bin", d_logits.data(), d_logits.size());
  for (int i = 0; i < 10; ++i) write_file(dir + "/d_w" + std::to_string(i) + ".bin", d_w[i].data(), d_w[i].size());
  return 0;
}
