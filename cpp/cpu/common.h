// What the CPU entry points share: threading, argument checks.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dcoco/dtype.h"
#include "dcoco/math.h"

namespace dcoco::cpu {

template <class F>
void parallel_for(int64_t n, F&& f) {
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int64_t i = 0; i < n; ++i) f(i);
}

inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

// cand_ids (R,B,K) as int64, each checked against [0, V).
inline std::vector<int64_t> checked_ids(const void* ids, DType t, int64_t R, int64_t B, int64_t K, int64_t V) {
  const int64_t n = R * B * K;
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = load_id(ids, t, i);
    if (out[i] < 0 || out[i] >= V) {
      const int64_t rank = i % K, slot = (i / K) % B, req = i / (K * B);
      throw std::out_of_range("cand_ids[" + std::to_string(req) + ", " + std::to_string(slot) + ", " +
                              std::to_string(rank) + "] = " + std::to_string(out[i]) + " is outside [0, V=" +
                              std::to_string(V) + ")");
    }
  }
  return out;
}

}  // namespace dcoco::cpu
