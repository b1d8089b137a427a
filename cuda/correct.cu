// Host launchers of the fused forward and the vocabulary table. The arch path is picked from the code the
// runtime loaded for the device (dcoco/dispatch.h), and the launch plan from the shared memory it allows.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cand_table.cuh"
#include "check.cuh"
#include "dcoco/api.h"
#include "fused_correct.cuh"

namespace dcoco::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct Device {
  int index, sms;
  Arch path;
  int64_t smem_cap;  // dynamic shared memory one CTA may have: the opt-in maximum less the static part
};

// What the runtime loaded for this device: its virtual arch, or nothing (no image fits the device).
std::optional<int> loaded_ptx(const void* kernel) {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, kernel) != cudaSuccess) {
    cudaGetLastError();  // e.g. cudaErrorNoKernelImageForDevice: not sticky, cleared here
    return std::nullopt;
  }
  return a.ptxVersion;
}

Device query(int index) {
  int major = 0, minor = 0, optin = 0, sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index), "dcoco.correct: device query");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index), "dcoco.correct: device query");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index), "dcoco.correct: device query");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, index), "dcoco.correct: device query");
  const std::string name = "sm_" + std::to_string(major) + std::to_string(minor);
  const auto best = best_path(major, minor, loaded_ptx(reinterpret_cast<const void*>(correct_kernel<Arch::simt>)),
                              DCOCO_CUDA_ARCHS_BUILT);
  if (!best)
    throw std::runtime_error("dcoco.correct: this build holds no code that runs on " + name + " (built for " +
                             DCOCO_CUDA_ARCHS_BUILT + ")");
  const Arch path = chosen_path(*best, std::getenv("DCOCO_CUDA_PATH"), name);
  cudaFuncAttributes a{};
  const void* kernels[] = {reinterpret_cast<const void*>(correct_kernel<Arch::simt>),
                           reinterpret_cast<const void*>(correct_kernel<Arch::sm80>),
                           reinterpret_cast<const void*>(correct_kernel<Arch::sm90>),
                           reinterpret_cast<const void*>(correct_kernel<Arch::sm100>)};
  check(cudaFuncGetAttributes(&a, kernels[int(path)]), "dcoco.correct: kernel attributes");
  return {index, sms, path, int64_t(optin) - int64_t(a.sharedSizeBytes)};
}

// Per device, queried once (racing threads compute the same answer).
const Device& current_device() {
  static Device known[kMaxDevices];
  static std::atomic<bool> ready[kMaxDevices];
  int index = 0;
  check(cudaGetDevice(&index), "dcoco.correct: no current CUDA device");
  if (index >= kMaxDevices) throw std::runtime_error("dcoco.correct: more than 64 CUDA devices");
  if (!ready[index].load(std::memory_order_acquire)) {
    known[index] = query(index);
    ready[index].store(true, std::memory_order_release);
  }
  return known[index];
}

template <Arch A>
void launch(const CorrectParams& p, const Plan& l, const Device& dev) {
  // The dynamic shared memory limit is raised once per device and size (not a stream operation, so the
  // first call may even happen under graph capture); racing threads set the same value.
  static std::atomic<int64_t> raised[kMaxDevices];
  if (raised[dev.index].load() < l.smem) {
    check(cudaFuncSetAttribute(correct_kernel<A>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.smem)),
          "dcoco.correct: " + std::to_string(l.smem) + " bytes of shared memory not available");
    raised[dev.index].store(l.smem);
  }
  correct_kernel<A><<<unsigned(l.ctas), kThreads, size_t(l.smem), static_cast<cudaStream_t>(p.stream)>>>(
      p, dev.sms, dev.smem_cap);
}

Plan fitting_plan(const CorrectParams& p, const Device& dev) {
  const Plan l = plan_of(p, dev.sms, dev.smem_cap);
  if (!l.fits)
    throw std::invalid_argument("dcoco.correct: needs " + std::to_string(l.smem) + " bytes of shared memory per " +
                                "block, the device allows " + std::to_string(dev.smem_cap) +
                                " (width r or mlp_hidden too large)");
  return l;
}

}  // namespace

std::string cuda_path() { return arch_name(current_device().path); }

std::pair<int64_t, int64_t> workspace_sizes(const CorrectParams& p) {
  const Plan l = fitting_plan(p, current_device());
  return {l.floats, l.ints};
}

void correct(const CorrectParams& p) {
  if (p.R == 0) return;
  if (!p.workspace || !p.counters) throw std::invalid_argument("dcoco.correct: CUDA workspace missing");
  const Device& dev = current_device();
  const Plan l = fitting_plan(p, dev);
  if (l.ctas > 0x7fffffff) throw std::invalid_argument("hidden: batch too large for one CUDA launch");
  switch (dev.path) {
    case Arch::sm100: launch<Arch::sm100>(p, l, dev); break;
    case Arch::sm90: launch<Arch::sm90>(p, l, dev); break;
    case Arch::sm80: launch<Arch::sm80>(p, l, dev); break;
    default: launch<Arch::simt>(p, l, dev);
  }
  check(cudaGetLastError(), "dcoco.correct: CUDA launch failed");
}

void cand_table(const CandTableParams& p) {
  if (p.V == 0) return;
  const size_t smem = size_t(kThreads / 32) * p.r * sizeof(float);
  if (smem > 48 * 1024) throw std::invalid_argument("cand_proj: width r too large for the CUDA table kernel");
  const auto blocks = unsigned((p.V + kThreads / 32 - 1) / (kThreads / 32));
  cand_table_kernel<<<blocks, kThreads, smem, static_cast<cudaStream_t>(p.stream)>>>(p);
  check(cudaGetLastError(), "dcoco.correct: CUDA launch failed");
}

}  // namespace dcoco::cuda
