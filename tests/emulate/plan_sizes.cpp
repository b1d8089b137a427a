// Prints the fused forward's launch plan (cuda/plan.cuh) for each line "R B K d r H table scores ranks sms cap"
// read from stdin: "fits smem G" per line. tests/ops/test_cuda_emulated.py checks every K against the devices' caps.
#include "cuda_emulation.h"
// the emulation header must come first: it defines the CUDA keywords plan.cuh uses
#include "plan.cuh"

#include <cstdio>
#include <iostream>

int main() {
  dcoco::ForwardParams p;
  long R, B, K, d, r, H, sms, cap;
  int table, scores, ranks;
  static float dummy;
  while (std::cin >> R >> B >> K >> d >> r >> H >> table >> scores >> ranks >> sms >> cap) {
    p.R = R, p.B = B, p.K = K, p.d = d, p.r = r, p.H = H;
    p.table = table ? &dummy : nullptr;
    p.scores = scores ? &dummy : nullptr;
    p.ranks = ranks ? reinterpret_cast<int64_t*>(&dummy) : nullptr;
    const dcoco::cuda::Plan l = dcoco::cuda::plan_of(p, int(sms), cap);
    std::printf("%d %ld %ld\n", int(l.fits), long(l.smem), long(l.group_slots));
  }
  return 0;
}
