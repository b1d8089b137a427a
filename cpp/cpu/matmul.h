// Y(M,N) = X(M,Kd) W(N,Kd)^T for the CPU path: the nn.Linear product on small row blocks.
// Register-blocked 4x4 over (rows, outputs) with 16 independent lanes along Kd, so the compiler
// emits packed FMAs without reassociating a float reduction; cloned per ISA at load time.
#pragma once
#include <cstdint>

namespace dcoco::cpu {

struct Mat {  // a row-major view: element (i,j) at ptr[i * ld + j]
  const float* ptr;
  int64_t ld;
};

// Y(M,N) with row stride ldy; X rows of length Kd at stride X.ld, W rows likewise.
void matmul_nt(Mat X, int64_t M, Mat W, int64_t N, int64_t Kd, float* Y, int64_t ldy);

}  // namespace dcoco::cpu
