// The dtype codes of the params structs, and reading any supported dtype's element as float (or T).
#pragma once
#include <cstdint>

#include "dcoco/host_device.h"

namespace dcoco {

enum class DType : int32_t { f32 = 0, bf16 = 1, f16 = 2, i32 = 3, i64 = 4, f64 = 5 };

DCOCO_HD float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// IEEE binary16 -> binary32, exact (normals, subnormals, inf, nan).
DCOCO_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
  // subnormal: man * 2^-24
  const float v = float(man) * 5.9604644775390625e-08f;
  return sign ? -v : v;
}

// Element i of a float array of any supported float dtype, as float.
DCOCO_HD float load_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Element i of a float array of any supported float dtype, as T (float64 is the training path's only).
template <class T>
DCOCO_HD T load_as(const void* p, DType t, int64_t i) {
  return t == DType::f64 ? T(static_cast<const double*>(p)[i]) : T(load_float(p, t, i));
}

// Element i of an id array (int32 or int64).
DCOCO_HD int64_t load_id(const void* p, DType t, int64_t i) {
  return t == DType::i32 ? int64_t(static_cast<const int32_t*>(p)[i]) : static_cast<const int64_t*>(p)[i];
}

}  // namespace dcoco
