// How the CPU hot loops are compiled: cloned per ISA (AVX-512, AVX2, baseline) and picked at load time,
// with their helpers forced inline so the clones vectorise them.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DCOCO_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DCOCO_ISA_CLONES
#endif
#define DCOCO_INLINE __attribute__((always_inline)) inline
