// Path selection for request q of a SelectParams batch, shared by the CPU loop and the CUDA kernel.
#pragma once
#include "dcoco/params.h"
#include "dcoco/walk.h"

namespace dcoco {

DCOCO_HD void select_one(const SelectParams& p, int64_t q) {
  const int B = int(p.B), K = int(p.K);
  float* first = p.work + q * 3 * K;
  for (int k = 0; k < K; ++k) first[k] = load_float(p.first_logits, p.first_dtype, q * K + k);
  const float* S = p.scores + q * (p.B - 1) * K * K;
  int64_t* ranks = p.ranks + q * p.B;
  if (p.rule == Rule::greedy)
    greedy_walk(S, first, B, K, ranks);
  else
    path_walk(S, first, B, K, p.rule == Rule::global ? 1.f : p.lam, first + K, p.next + q * (p.B - 1) * K, ranks);
}

}  // namespace dcoco
