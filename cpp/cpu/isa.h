// How the CPU hot loops are compiled for the machine they run on, picked once at load time:
//   x86-64-v4 (AVX-512 + FMA), x86-64-v3 (AVX2 + FMA) and the baseline.
// Loops whose speed does not depend on register tiling are cloned by the compiler (DCOCO_ISA_CLONES).
// Register-tiled loops must size their tiles to the register file (16 zmm of 64 bytes hold what 32 ymm
// would; a tile sized for AVX-512 spills on AVX2), so they are templates on the vector width VB in bytes,
// instantiated per ISA and dispatched by DCOCO_DISPATCH_VB.
#pragma once

#define DCOCO_INLINE __attribute__((always_inline)) inline

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DCOCO_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define DCOCO_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#define DCOCO_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
namespace dcoco::cpu {
// 64 on x86-64-v4, 32 on x86-64-v3, 16 otherwise: the vector width the register tiles are sized for.
inline int vector_bytes() {
  static const int vb = __builtin_cpu_supports("x86-64-v4") ? 64 : __builtin_cpu_supports("x86-64-v3") ? 32 : 16;
  return vb;
}
}  // namespace dcoco::cpu
// Defines `name params` calling `body<VB> args` compiled for the running CPU's ISA.
#define DCOCO_DISPATCH_VB(name, body, params, args)                     \
  namespace {                                                           \
  DCOCO_TARGET_V4 void name##_v4 params { body<64> args; }              \
  DCOCO_TARGET_V3 void name##_v3 params { body<32> args; }              \
  void name##_v0 params { body<16> args; }                              \
  }                                                                     \
  void name params {                                                    \
    const int vb = vector_bytes();                                      \
    if (vb == 64) return name##_v4 args;                                \
    if (vb == 32) return name##_v3 args;                                \
    return name##_v0 args;                                              \
  }
#else
#define DCOCO_ISA_CLONES
#define DCOCO_DISPATCH_VB(name, body, params, args) \
  void name params { body<16> args; }
#endif
