// The tensor-core instructions of cuda/sm80_mma.cuh, sm90_gmma.cuh and sm100_umma.cuh emulated on the CPU, each
// from the PTX ISA's fragment and descriptor layouts (the section is cited where it is written). Include after
// cuda_emulation.h (built with -DDCOCO_EMULATE_MMA) and before the kernels.
#pragma once
#include "emu_sm80.h"
#include "emu_sm90.h"
#include "emu_sm100.h"
