// Runs the fused forward through its real host launcher (cuda/forward.cu: dispatch, plan, launch) under
// tests/emulate/cuda_emulation.h, on a fake device, on inputs written by tests/ops/test_cuda_emulated.py: argv[1] is a
// folder with meta.txt and raw .bin arrays; outputs go there. DCOCO_CUDA_PATH picks the path, as on a GPU; built
// with -DDCOCO_EMULATE_MMA the tensor-core paths run their instructions' emulation (tensor_cores.h).
// Exit codes: 5 the plan does not fit the device, 3/4 a counter is off, 6 a write past the launch's shared memory,
// 7 an instruction that is not emulated, 8 a CUDA error.
#include "cuda_emulation.h"
// the emulation header must come first: it defines the CUDA keywords the kernel uses
#if defined(DCOCO_EMULATE_MMA)
#include "tensor_cores.h"
#endif
#include "forward.cu"
#if defined(DCOCO_EMULATE_MMA)
#include "device.cu"  // needs CUTLASS's version header, which only the tensor-core build has on its path
#endif

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "inputs.h"

using namespace dcoco;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  ForwardParams p;
  Inputs in(dir, p);
  int has_table, want_scores;
  int64_t launch;  // 0: the launcher's plan; else launch the SIMT kernel directly with these bytes (the guard test)
  emu::Device& dev = emu::device;
  in.meta >> has_table >> want_scores >> dev.sms >> dev.optin >> launch >> dev.major >> dev.minor >> dev.ptx;
  const auto table = read_file(dir + "/table.bin");
  p.table = has_table ? reinterpret_cast<const float*>(table.data()) : nullptr;
  // outputs poisoned, as in the Python tests
  std::vector<float> scores(want_scores ? p.R * (p.B - 1) * p.K * p.K : 0, __int_as_float(0x7fc00000));
  std::vector<int64_t> ranks(p.R * p.B, -1), tokens(p.R * p.B, -1);
  p.scores = want_scores ? scores.data() : nullptr;
  p.ranks = ranks.data(), p.tokens = tokens.data();
  const int64_t cap = dev.optin - dev.static_smem;
  const dcoco::cuda::Plan plan = dcoco::cuda::plan_of(p, dev.sms, cap);
  std::vector<float> workspace;
  std::vector<int32_t> counters;
  try {
    const auto [floats, ints] =
        launch ? std::pair(plan.workspace_floats, plan.counter_ints) : dcoco::cuda::workspace_sizes(p);
    workspace.assign(floats, __int_as_float(0x7fc00000)), counters.assign(ints, 0);
    p.workspace = workspace.data(), p.counters = counters.data();
    if (launch)
      emu::launch(dim3(unsigned(plan.ctas)), dim3(dcoco::cuda::kThreads), size_t(launch),
                  [&] { dcoco::cuda::forward_kernel<Arch::simt>(p, dev.sms, cap); });
    else
      dcoco::cuda::forward(p);
    std::printf("path %s\n", launch ? "simt" : dcoco::cuda::cuda_path().c_str());
#if defined(DCOCO_EMULATE_MMA)
    const auto [devices, name] = dcoco::cuda::status();
    std::printf("device %d %s, CUTLASS %s%s\n", devices, name.c_str(), dcoco::cuda::cutlass_version().c_str(),
                dcoco::cuda::built() ? "" : " (not built)");
#endif
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 5;
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 8;
  }
  if (counters[plan.ticket] != plan.ctas) return 3;  // every CTA took exactly one ticket
  for (int64_t g = 0; g < plan.groups; ++g)
    if (counters[plan.group_done + g] != plan.fuse_col_tiles) return 4;  // every stage-2 tile arrived
  for (int64_t q = 0; q < p.R && plan.has_grid; ++q)  // every grid tile of the request arrived
    if (counters[plan.grid_done + q] != (p.B - 1) * plan.tiles_per_transition) return 4;
  std::printf("ksplit %ld G %ld smem %ld stage tiles %ld %ld %ld %ld walk %s\n", long(plan.k_splits),
              long(plan.group_slots), long(plan.smem), long(plan.project_tiles), long(plan.fuse_tiles),
              long(plan.score_tiles), long(plan.walk_tiles),
              !plan.has_grid ? "rows" : plan.grid_in_smem ? "grid-smem" : "grid");
  if (want_scores) write_file(dir + "/scores.bin", scores.data(), scores.size());
  write_file(dir + "/ranks.bin", ranks.data(), ranks.size());
  write_file(dir + "/tokens.bin", tokens.data(), tokens.size());
  return 0;
}
