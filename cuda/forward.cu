// Host launchers of the fused forward and the vocabulary table. The arch path is picked from the code the
// runtime loaded for the device (dcoco/dispatch.h), and the launch plan from the shared memory it allows.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cand_table.cuh"
#include "check.cuh"
#include "dcoco/api.h"
#include "fused_forward.cuh"

namespace dcoco::cuda {

namespace {

constexpr int kMaxDevices = 64;

// What a device offers, queried once per device (racing threads compute the same answer).
struct Device {
  int index, sms;
  Arch best;                  // the fastest path of the code the runtime loaded for it
  int64_t optin;              // its opt-in shared memory per block
  int64_t static_smem[4];     // forward_kernel<A>'s static shared memory, per Arch
  char name[16];              // sm_XY
};

// A call's choice on a device: the path (DCOCO_CUDA_PATH is read at every call) and the dynamic shared memory
// one CTA may have there: the opt-in maximum less that kernel's static part.
struct Launch {
  const Device& dev;
  Arch path;
  int64_t smem_cap;
};

const void* kernel_of(Arch a) {
  switch (a) {
    case Arch::sm100: return reinterpret_cast<const void*>(forward_kernel<Arch::sm100>);
    case Arch::sm90: return reinterpret_cast<const void*>(forward_kernel<Arch::sm90>);
    case Arch::sm80: return reinterpret_cast<const void*>(forward_kernel<Arch::sm80>);
    default: return reinterpret_cast<const void*>(forward_kernel<Arch::simt>);
  }
}

Device query(int index) {
  Device d{};
  int major = 0, minor = 0, optin = 0;
  d.index = index;
  check(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, index), "dcoco.correct: device query");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index), "dcoco.correct: device query");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index), "dcoco.correct: device query");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, index), "dcoco.correct: device query");
  std::snprintf(d.name, sizeof d.name, "sm_%d%d", major, minor);
  cudaFuncAttributes a{};
  const cudaError_t loaded = cudaFuncGetAttributes(&a, kernel_of(Arch::simt));
  if (loaded != cudaSuccess) cudaGetLastError();  // e.g. cudaErrorNoKernelImageForDevice: not sticky, cleared
  const auto best = best_path(major, minor, loaded == cudaSuccess ? std::optional<int>(a.ptxVersion) : std::nullopt,
                              DCOCO_CUDA_ARCHS_BUILT);
  if (!best)
    throw std::runtime_error(std::string("dcoco.correct: this build holds no code that runs on ") + d.name +
                             " (built for " + DCOCO_CUDA_ARCHS_BUILT + ")");
  d.best = *best, d.optin = optin;
  for (Arch k : {Arch::simt, Arch::sm80, Arch::sm90, Arch::sm100}) {
    check(cudaFuncGetAttributes(&a, kernel_of(k)), "dcoco.correct: kernel attributes");
    d.static_smem[int(k)] = int64_t(a.sharedSizeBytes);
  }
  return d;
}

Launch current_launch() {
  static Device known[kMaxDevices];
  static std::atomic<bool> ready[kMaxDevices];
  int index = 0;
  check(cudaGetDevice(&index), "dcoco.correct: no current CUDA device");
  if (index >= kMaxDevices) throw std::runtime_error("dcoco.correct: more than 64 CUDA devices");
  if (!ready[index].load(std::memory_order_acquire)) {
    known[index] = query(index);
    ready[index].store(true, std::memory_order_release);
  }
  const Device& dev = known[index];
  const Arch path = chosen_path(dev.best, std::getenv("DCOCO_CUDA_PATH"), dev.name);
  return {dev, path, dev.optin - dev.static_smem[int(path)]};
}

template <Arch A>
void launch(const ForwardParams& p, const Plan& l, const Launch& at) {
  // The dynamic shared memory limit is raised once per device, kernel and size (not a stream operation, so the
  // first call may even happen under graph capture); racing threads set the same value.
  static std::atomic<int64_t> raised[kMaxDevices];
  if (raised[at.dev.index].load() < l.smem) {
    check(cudaFuncSetAttribute(kernel_of(A), cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.smem)),
          "dcoco.correct: " + std::to_string(l.smem) + " bytes of shared memory not available");
    raised[at.dev.index].store(l.smem);
  }
  DCOCO_LAUNCH(forward_kernel<A>, unsigned(l.ctas), kThreads, size_t(l.smem), static_cast<cudaStream_t>(p.stream))(
      p, at.dev.sms, at.smem_cap);
}

Plan fitting_plan(const ForwardParams& p, const Launch& at) {
  const Plan l = plan_of(p, at.dev.sms, at.smem_cap);
  if (!l.fits)
    throw std::invalid_argument("dcoco.correct: needs " + std::to_string(l.smem) + " bytes of shared memory per " +
                                "block, the device allows " + std::to_string(at.smem_cap) +
                                " (width r or mlp_hidden too large)");
  return l;
}

}  // namespace

std::string cuda_path() { return arch_name(current_launch().path); }

std::pair<int64_t, int64_t> workspace_sizes(const ForwardParams& p) {
  const Plan l = fitting_plan(p, current_launch());
  return {l.workspace_floats, l.counter_ints};
}

void forward(const ForwardParams& p) {
  if (p.R == 0) return;
  if (!p.workspace || !p.counters) throw std::invalid_argument("dcoco.correct: CUDA workspace missing");
  const Launch at = current_launch();
  const Plan l = fitting_plan(p, at);
  if (l.ctas > 0x7fffffff) throw std::invalid_argument("hidden: batch too large for one CUDA launch");
  switch (at.path) {
    case Arch::sm100: launch<Arch::sm100>(p, l, at); break;
    case Arch::sm90: launch<Arch::sm90>(p, l, at); break;
    case Arch::sm80: launch<Arch::sm80>(p, l, at); break;
    default: launch<Arch::simt>(p, l, at);
  }
  check(cudaGetLastError(), "dcoco.correct: CUDA launch failed");
}

void cand_table(const CandTableParams& p) {
  if (p.V == 0) return;
  const size_t smem = size_t(kThreads / 32) * p.r * sizeof(float);
  if (smem > 48 * 1024) throw std::invalid_argument("cand_proj: width r too large for the CUDA table kernel");
  const auto blocks = unsigned((p.V + kThreads / 32 - 1) / (kThreads / 32));
  DCOCO_LAUNCH(cand_table_kernel, blocks, kThreads, smem, static_cast<cudaStream_t>(p.stream))(p);
  check(cudaGetLastError(), "dcoco.correct: CUDA launch failed");
}

}  // namespace dcoco::cuda
