// Runs the vocabulary table (cuda/cand_table.cuh) and dcoco.select (cuda/select.cu) through their real host
// launchers under tests/emulate/cuda_emulation.h, on inputs written by tests/ops/test_cuda_emulated.py (inputs.h,
// plus grid.bin: an (R,B-1,K,K) float grid, and in meta.txt the select rule and lambda). Writes table.bin
// (V,r) and ranks-<rule>.bin (R,B). Exit 8: a CUDA error or a refused argument.
#include "cuda_emulation.h"
// the emulation header must come first: it defines the CUDA keywords the kernels use
#include "forward.cu"
#include "select.cu"

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "inputs.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  dcoco::ForwardParams c;
  Inputs in(dir, c);
  int rule;
  float lam;
  in.meta >> rule >> lam;
  const float nan = __int_as_float(0x7fc00000);  // outputs poisoned
  dcoco::CandTableParams t;
  t.V = c.V, t.d = c.d, t.r = c.r, t.embed = c.embed, t.embed_dtype = c.embed_dtype;
  t.cand_proj = c.w.cand_proj, t.fuse_proj = c.w.fuse_proj;
  std::vector<float> table(t.V * t.r, nan);
  t.table = table.data();
  // slot 1's logits, (R,K), of the cand_logits' dtype
  const size_t es = c.logits_dtype == dcoco::DType::f32 ? 4 : 2;
  std::vector<char> first(c.R * c.K * es);
  for (int64_t q = 0; q < c.R; ++q)
    std::memcpy(first.data() + q * c.K * es, static_cast<const char*>(c.cand_logits) + q * c.B * c.K * es, c.K * es);
  const auto grid = read_file(dir + "/grid.bin");
  dcoco::SelectParams s;
  s.R = c.R, s.B = c.B, s.K = c.K, s.scores = reinterpret_cast<const float*>(grid.data());
  s.first_logits = first.data(), s.first_dtype = c.logits_dtype, s.rule = dcoco::Rule(rule), s.lam = lam;
  std::vector<float> work(c.R * 3 * c.K, nan);
  std::vector<int32_t> next(c.R * (c.B > 1 ? c.B - 1 : 1) * c.K, -1);
  std::vector<int64_t> ranks(c.R * c.B, -1);
  s.work = work.data(), s.next = next.data(), s.ranks = ranks.data();
  try {
    dcoco::cuda::cand_table(t);
    dcoco::cuda::select(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 8;
  }
  write_file(dir + "/table.bin", table.data(), table.size());
  write_file(dir + "/ranks-" + std::to_string(rule) + ".bin", ranks.data(), ranks.size());
  return 0;
}
