// Host launchers of the fused forward and the vocabulary table: the kernel's arch path is picked from the
// device's compute capability (sm_100 -> tcgen05, sm_90 -> wgmma, sm_80 and later -> mma.sync, older -> SIMT).
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
  int index, sms, major;
};

Device current_device() {
  Device d{};
  check(cudaGetDevice(&d.index), "dcoco.correct: no current CUDA device");
  check(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, d.index), "dcoco.correct: device query");
  check(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, d.index), "dcoco.correct: device query");
  return d;
}

// The device's path, or the one DCOCO_CUDA_PATH (simt | sm80 | sm90 | sm100) forces, where it can run.
Arch arch_of(const Device& dev) {
  const Arch best = dev.major == 10 ? Arch::sm100 : dev.major == 9 ? Arch::sm90 : dev.major >= 8 ? Arch::sm80 : Arch::simt;
  const char* force = std::getenv("DCOCO_CUDA_PATH");
  if (!force || !*force) return best;
  const std::string f = force;
  if (f == "simt") return Arch::simt;
  if (f == "sm80" && dev.major >= 8) return Arch::sm80;
  if (f == "sm90" && dev.major == 9) return Arch::sm90;
  if (f == "sm100" && dev.major == 10) return Arch::sm100;
  throw std::invalid_argument("DCOCO_CUDA_PATH=" + f + ": expected simt, sm80 (compute capability 8.0 or later), "
                              "sm90 (9.x) or sm100 (10.x); this device is " + std::to_string(dev.major) + ".x");
}

template <Arch A>
void launch(const CorrectParams& p, const Plan& l, const Device& dev) {
  // The dynamic shared memory limit is raised once per device and size (not a stream operation, so the
  // first call may even happen under graph capture); racing threads set the same value.
  static std::atomic<int64_t> raised[kMaxDevices];
  if (dev.index >= kMaxDevices || raised[dev.index].load() < l.smem) {
    check(cudaFuncSetAttribute(correct_kernel<A>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.smem)),
          "dcoco.correct: " + std::to_string(l.smem) + " bytes of shared memory not available (width r too large?)");
    if (dev.index < kMaxDevices) raised[dev.index].store(l.smem);
  }
  correct_kernel<A><<<unsigned(l.ctas), kThreads, size_t(l.smem), static_cast<cudaStream_t>(p.stream)>>>(p, dev.sms);
}

}  // namespace

std::pair<int64_t, int64_t> workspace_sizes(const CorrectParams& p) {
  const Plan l = plan_of(p, current_device().sms);
  return {l.floats, l.ints};
}

void correct(const CorrectParams& p) {
  if (p.R == 0) return;
  if (!p.workspace || !p.counters) throw std::invalid_argument("dcoco.correct: CUDA workspace missing");
  const Device dev = current_device();
  const Plan l = plan_of(p, dev.sms);
  if (l.ctas > 0x7fffffff) throw std::invalid_argument("hidden: batch too large for one CUDA launch");
  switch (arch_of(dev)) {
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
