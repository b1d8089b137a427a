// The CUDA runtime functions dcoco's launchers call (cuda/*.cu), defined for one fake device so the real
// launchers run under the emulation: the dispatch sees the device's arch and loaded image, plans fit its
// shared memory, and a launch asking for more dynamic shared memory than the kernel was allowed fails with
// cudaErrorInvalidValue, as on a GPU. Included once per emulated program (these are the definitions).
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <map>

// The archs cuda/forward.cu's dispatch believes were built (CMake passes the real list).
#ifndef DCOCO_CUDA_ARCHS_BUILT
#define DCOCO_CUDA_ARCHS_BUILT "80,90a,100a"
#endif

namespace emu {

struct Device {
  int sms = 132, major = 9, minor = 0;
  int optin = 227 * 1024;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  int ptx = 90;            // the loaded image's ptxVersion; < 0: no image of the build loads on this device
  int static_smem = 1024;  // every kernel's static shared memory, as cudaFuncGetAttributes reports it
};
inline Device device;
inline cudaError_t last_error = cudaSuccess;
inline std::map<const void*, int> max_dynamic;  // cudaFuncAttributeMaxDynamicSharedMemorySize, per kernel

inline cudaError_t fail(cudaError_t e) { return last_error = e; }

inline int dynamic_limit(const void* kernel) {
  const auto it = max_dynamic.find(kernel);
  return it == max_dynamic.end() ? 48 * 1024 : it->second;
}

// kernel<<<grid, block, smem>>>(args...): arguments are copied, as a launch copies them.
template <class... Params>
auto launcher(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem) {
  return [=](auto&&... args) {
    if (grid.x == 0 || block.x == 0 || block.x > 1024 || smem > size_t(dynamic_limit((const void*)kernel))) {
      fail(cudaErrorInvalidValue);
      return;
    }
    auto copies = std::make_tuple(Params(args)...);
    launch(grid, block, smem, [&] { std::apply(kernel, copies); });
  };
}

}  // namespace emu

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    default: return "emulated CUDA error";
  }
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* index) {
  *index = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int index) {
  if (index != 0) return emu::fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "emulated");
  prop->major = emu::device.major, prop->minor = emu::device.minor;
  prop->multiProcessorCount = emu::device.sms;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int index) {
  if (index != 0) return emu::fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = emu::device.sms; break;
    case cudaDevAttrComputeCapabilityMajor: *value = emu::device.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = emu::device.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = emu::device.optin; break;
    default: emu::unemulated("cudaDeviceGetAttribute of this attribute");
  }
  return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void* kernel) {
  if (emu::device.ptx < 0) return emu::fail(cudaErrorNoKernelImageForDevice);
  *a = cudaFuncAttributes{};
  a->ptxVersion = emu::device.ptx;
  a->binaryVersion = emu::device.major * 10 + emu::device.minor;
  a->sharedSizeBytes = size_t(emu::device.static_smem);
  a->maxDynamicSharedSizeBytes = emu::dynamic_limit(kernel);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) emu::unemulated("cudaFuncSetAttribute of this attribute");
  if (value < 0 || value > emu::device.optin - emu::device.static_smem) return emu::fail(cudaErrorInvalidValue);
  emu::max_dynamic[kernel] = value;
  return cudaSuccess;
}

}  // extern "C"
