// Runs the fused forward (cuda/fused_correct.cuh, its SIMT policy) under tests/emulate/cuda_emulation.h on
// inputs written by tests/test_cuda_emulated.py: argv[1] is a folder with meta.txt and raw .bin arrays;
// outputs go there. The plan is made for the shared-memory cap in meta.txt; one over it exits with 5.
#include "cuda_emulation.h"
// the emulation header must come first: it defines the CUDA keywords the kernel uses
#include "fused_correct.cuh"

#include <cstdio>
#include <string>
#include <vector>

#include "inputs.h"

using namespace dcoco;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  CorrectParams p;
  Inputs in(dir, p);
  int has_table, want_scores, sms;
  int64_t cap, launch;  // the device's dynamic shared memory per block; bytes to launch with (0: the plan's)
  in.meta >> has_table >> want_scores >> sms >> cap >> launch;
  const auto table = read_file(dir + "/table.bin");
  p.table = has_table ? reinterpret_cast<const float*>(table.data()) : nullptr;
  // outputs poisoned, as in the Python tests
  std::vector<float> scores(want_scores ? p.R * (p.B - 1) * p.K * p.K : 0, __int_as_float(0x7fc00000));
  std::vector<int64_t> ranks(p.R * p.B, -1), tokens(p.R * p.B, -1);
  p.scores = want_scores ? scores.data() : nullptr;
  p.ranks = ranks.data(), p.tokens = tokens.data();
  const cuda::Plan plan = cuda::plan_of(p, sms, cap);
  if (!plan.fits) {
    std::fprintf(stderr, "plan needs %ld bytes of shared memory per block, the cap is %ld\n", long(plan.smem),
                 long(cap));
    return 5;
  }
  std::vector<float> workspace(plan.floats, __int_as_float(0x7fc00000));
  std::vector<int32_t> counters(plan.ints, 0);
  p.workspace = workspace.data(), p.counters = counters.data();
  emu::launch(dim3(unsigned(plan.ctas)), dim3(cuda::kThreads), size_t(launch ? launch : plan.smem),
              [&] { cuda::correct_kernel<Arch::simt>(p, sms, cap); });
  if (counters[plan.ticket] != plan.ctas) return 3;  // every CTA took exactly one ticket
  for (int64_t g = 0; g < plan.groups; ++g)
    if (counters[plan.group_done + g] != plan.g_nt) return 4;  // every stage-2 tile arrived
  for (int64_t q = 0; q < p.R && want_scores; ++q)
    if (counters[plan.grid_done + q] != p.B - 1) return 4;
  std::printf("ksplit %ld G %ld smem %ld stage tiles %ld %ld %ld %ld\n", long(plan.ksplit), long(plan.G),
              long(plan.smem), long(plan.stage1), long(plan.stage2), long(plan.stage3), long(plan.stage4));
  if (want_scores) write_file(dir + "/scores.bin", scores.data(), scores.size());
  write_file(dir + "/ranks.bin", ranks.data(), ranks.size());
  write_file(dir + "/tokens.bin", tokens.data(), tokens.size());
  return 0;
}
