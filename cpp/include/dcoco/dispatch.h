// Which arch path of the fused CUDA kernel may run on a device, decided from the code the runtime actually
// loaded for it, never from the compute capability alone. Pure host C++ (no CUDA headers), so the CPU tests
// check every branch with fake devices.
//
// The kernel's tensor-core paths are compiled only into images whose target has their instructions; every other
// image holds a trap there (fused_forward.cuh, compiled_for). The driver picks one image per device: native
// SASS for it, or else the newest PTX it can JIT (sm_103 with a "100a" build: the compute_80 PTX). That image's
// virtual arch (cudaFuncAttributes::ptxVersion, e.g. 90) plus whether it was built arch-specific ("90a" in
// DCOCO_CUDA_ARCHS) says which paths it holds.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dcoco {

enum class Arch { simt, sm80, sm90, sm100 };

inline const char* arch_name(Arch a) {
  return a == Arch::sm100 ? "sm100" : a == Arch::sm90 ? "sm90" : a == Arch::sm80 ? "sm80" : "simt";
}

// Whether built (DCOCO_CUDA_ARCHS joined by commas, e.g. "80,90a,100a") holds arch-specific code ("a": what
// compiled_for requires) for the virtual arch ptx (e.g. 90).
inline bool built_specific(std::string_view built, int ptx) {
  const std::string a = std::to_string(ptx) + "a";
  for (size_t i = 0; i <= built.size();) {
    const size_t j = built.find(',', i) == std::string_view::npos ? built.size() : built.find(',', i);
    const std::string_view item = built.substr(i, j - i);
    if (item == a) return true;
    i = j + 1;
  }
  return false;
}

// The fastest path the loaded image holds, for a device of compute capability major.minor. ptx: the loaded
// image's virtual arch as major*10+minor, or nullopt when no image loads for the device (then nothing runs).
inline std::optional<Arch> best_path(int major, int minor, std::optional<int> ptx, std::string_view built) {
  if (!ptx) return std::nullopt;
  const int v = *ptx, cc = major * 10 + minor;
  if (v / 10 == 10 && v == cc && built_specific(built, v)) return Arch::sm100;  // tcgen05: sm_100a, sm_103a
  if (v == 90 && cc == 90 && built_specific(built, 90)) return Arch::sm90;      // wgmma: sm_90a only
  if (v >= 80) return Arch::sm80;                                                // mma.sync: any sm_80+ image
  return Arch::simt;
}

// best, or the path DCOCO_CUDA_PATH forces (simt | sm80 | sm90 | sm100) when the image holds it.
inline Arch chosen_path(Arch best, const char* force, const std::string& device) {
  if (!force || !*force) return best;
  const std::string f = force;
  for (Arch a : {Arch::simt, Arch::sm80, Arch::sm90, Arch::sm100}) {
    if (f != arch_name(a)) continue;
    const bool held = a == Arch::simt || a == best || (a == Arch::sm80 && best != Arch::simt);
    if (held) return a;
    throw std::invalid_argument("DCOCO_CUDA_PATH=" + f + ": the code loaded for " + device + " has no " + f +
                                " path (its best is " + arch_name(best) + ")");
  }
  throw std::invalid_argument("DCOCO_CUDA_PATH=" + f + ": expected simt, sm80, sm90 or sm100");
}

}  // namespace dcoco
