// Path selection on a score grid: the greedy walk and the best whole path, shared by the CPU path, the fused
// kernel's walk and the select op.
#pragma once
#include <cstdint>

#include "dcoco/host_device.h"

namespace dcoco {

// Selection order: a larger value wins, NaN loses to every number, ties keep the lower rank
// (callers scan ranks upwards and replace only on a strict win).
DCOCO_HD bool wins(float x, float best) { return x > best || (best != best && x == x); }

DCOCO_HD int argmax(const float* v, int n) {
  int k = 0;
  for (int i = 1; i < n; ++i)
    if (wins(v[i], v[k])) k = i;
  return k;
}

// Prefix-first greedy on a score grid. S: (B-1,K,K), first: (K) slot-1 logits, ranks: (B).
DCOCO_HD void greedy_walk(const float* S, const float* first, int B, int K, int64_t* ranks) {
  int k = argmax(first, K);
  ranks[0] = k;
  for (int p = 0; p + 1 < B; ++p) {
    k = argmax(S + (int64_t(p) * K + k) * K, K);
    ranks[p + 1] = k;
  }
}

// Best whole path of  first[k_0] + sum_p lam^p S_p(k_p, k_{p+1})  (lam = 1: Global-Sum,
// lam < 1: Geometric), by a backward Viterbi pass that keeps each node's best successor; the path
// is then read forwards, so ties go to the lower rank at the earliest slot.
// Scratch: V (2,K) floats, next (B-1,K) ints. O(B K^2).
DCOCO_HD void path_walk(const float* S, const float* first, int B, int K, float lam, float* V,
                        int32_t* next, int64_t* ranks) {
  float* cur = V;       // suffix values of slot p
  float* after = V + K;  // suffix values of slot p+1
  for (int b = 0; b < K; ++b) after[b] = 0.f;
  for (int p = B - 2; p >= 0; --p) {
    float w = 1.f;  // lam^p
    for (int i = 0; i < p; ++i) w *= lam;
    for (int a = 0; a < K; ++a) {
      const float* row = S + (int64_t(p) * K + a) * K;
      int kb = 0;
      float best = w * row[0] + after[0];
      for (int b = 1; b < K; ++b) {
        const float v = w * row[b] + after[b];
        if (wins(v, best)) best = v, kb = b;
      }
      cur[a] = best;
      next[int64_t(p) * K + a] = kb;
    }
    for (int a = 0; a < K; ++a) after[a] = cur[a];
  }
  int k = 0;
  float best = first[0] + after[0];
  for (int a = 1; a < K; ++a)
    if (wins(first[a] + after[a], best)) best = first[a] + after[a], k = a;
  ranks[0] = k;
  for (int p = 0; p + 1 < B; ++p) ranks[p + 1] = k = next[int64_t(p) * K + k];
}

}  // namespace dcoco
