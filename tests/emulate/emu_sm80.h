// The sm_80 tensor-core instructions of cuda/sm80_mma.cuh emulated on the CPU, from the PTX ISA (8.x numbering;
// the anchor of docs.nvidia.com/cuda/parallel-thread-execution is given too, as section numbers move between
// versions):
//   ldmatrix.sync.aligned.m8n8.x4.shared.b16 (not .trans)           CuTe SM75_U32x4_LDSM_N
//   mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 CuTe SM80_16x8x16_F32{BF16BF16,F16F16}F32_TN
// Both are warp-collective: each lane hands in only what it holds (its row address, its A/B fragment registers)
// through a per-warp slot of a per-block buffer, the warp meets at __syncwarp(), and each lane then computes only
// its own destination registers from the PTX fragment layout; a second __syncwarp() frees the slots. Nothing here
// reads CuTe's Tensor views of the tile, so a wrong smem layout, swizzle or fragment partition shows as a wrong
// product.
// Hooked in through CuTe's own dispatch: MMA_Atom::call and Copy_Atom::call make unqualified calls
// mma_unpack(traits, D, A, B, C) / copy_unpack(traits, src, dst); the overloads below, for the exact traits, are
// more specialised than CuTe's generic ones and win (found by ADL: the traits live in namespace cute).
#pragma once
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

namespace emu::sm80 {

struct MmaRegs {  // one lane's A (4 x .b32, 8 x 16-bit) and B (2 x .b32, 4 x 16-bit) fragment of m16n8k16
  uint32_t a[4], b[2];
};
inline thread_local std::vector<const char*> ldsm_rows;  // per thread: the row address it hands to ldmatrix
inline thread_local std::vector<MmaRegs> mma_regs;       // per thread: its mma.sync operand registers

inline void reset_block() {
  ldsm_rows.assign(emu::block_dim.x, nullptr);
  mma_regs.assign(emu::block_dim.x, MmaRegs{});
}
inline const bool registered = (emu::block_resets().push_back(&reset_block), true);

// PTX ISA 9.7.14.5.15 "Warp-level matrix load instruction: ldmatrix" (#warp-level-matrix-instructions-ldmatrix):
// .x4 loads four 8x8 matrices of 16-bit elements; threads 8i..8i+7 supply the addresses of rows 0..7 of matrix i
// (each row 16 contiguous bytes, 16-byte aligned, in .shared). Destination register d_i of lane t holds matrix i's
// row t/4, elements 2(t%4) and 2(t%4)+1 (the lower-numbered element in the low half): the same fragment as an
// m16n8k16 A/B register ("Matrix fragments for mma.m16n8k16", below).
inline void ldmatrix_x4(const void* row, uint32_t& d0, uint32_t& d1, uint32_t& d2, uint32_t& d3) {
  const unsigned me = threadIdx.x, lane = me % 32, warp0 = me - lane;
  if (reinterpret_cast<uintptr_t>(row) % 16) emu::unemulated("ldmatrix: a row address that is not 16-byte aligned");
  (void)__cvta_generic_to_shared(row);  // .shared: the address must lie in the block's (dynamic) shared memory
  ldsm_rows[me] = static_cast<const char*>(row);
  __syncwarp();
  uint32_t* d[4] = {&d0, &d1, &d2, &d3};
  for (unsigned i = 0; i < 4; ++i) {
    const char* r = ldsm_rows[warp0 + 8 * i + lane / 4];  // row lane/4 of matrix i, from the lane that addressed it
    std::memcpy(d[i], r + 4 * (lane % 4), 4);             // elements 2(lane%4), 2(lane%4)+1
  }
  __syncwarp();
}

template <class Elem>
inline float to_float(uint16_t bits) {
  if constexpr (std::is_same_v<Elem, cute::bfloat16_t>) return float(cute::bfloat16_t::bitcast(bits));
  else return float(cute::half_t::bitcast(bits));
}

// PTX ISA 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type"
// (#warp-level-matrix-fragment-mma-16816-float); groupID = lane/4, threadID_in_group = lane%4:
//   A (16x16, .row): a_i, i = 0..7 (two per .b32, lower i in the low half):
//                    row = groupID + 8 for i in {2,3,6,7} else groupID; col = 2 threadID_in_group + (i&1) + 8 (i>=4)
//   B (16x8, .col):  b_i, i = 0..3: row (k) = 2 threadID_in_group + (i&1) + 8 (i>=2); col (n) = groupID
//   C, D (16x8 f32): c_i, i = 0..3: row = groupID + 8 (i>=2); col = 2 threadID_in_group + (i&1)
// D = A B + C with fp32 accumulation (products of 16-bit operands are exact in fp32; the summation order of the
// hardware is not reproduced). The lane that holds A(m,k) is 4 (m%8) + (k%8)/2, register (m>=8) + 2 (k>=8),
// half k&1; B(k,n): lane 4n + (k%8)/2, register k>=8, half k&1.
template <class Elem>
inline void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c) {
  const unsigned me = threadIdx.x, lane = me % 32, warp0 = me - lane;
  MmaRegs& mine = mma_regs[me];
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  const float cin[4] = {c[0], c[1], c[2], c[3]};  // D may alias C
  __syncwarp();
  auto half = [](uint32_t reg, int k) { return uint16_t(reg >> (16 * (k & 1))); };
  auto A = [&](int m, int k) {
    return to_float<Elem>(half(mma_regs[warp0 + 4 * (m % 8) + (k % 8) / 2].a[(m >= 8) + 2 * (k >= 8)], k));
  };
  auto B = [&](int k, int n) { return to_float<Elem>(half(mma_regs[warp0 + 4 * n + (k % 8) / 2].b[k >= 8], k)); };
  const int g = int(lane / 4), t = int(lane % 4);
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int m = g + 8 * (i >= 2), n = 2 * t + (i & 1);
    float acc = cin[i];
    for (int k = 0; k < 16; ++k) acc += A(m, k) * B(k, n);
    out[i] = acc;
  }
  __syncwarp();
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

}  // namespace emu::sm80

namespace cute {

// ldmatrix .x4: src is this lane's one uint128_t (its row), dst its four .b32 registers
template <class SEngine, class SLayout, class DEngine, class DLayout>
inline void copy_unpack(Copy_Traits<SM75_U32x4_LDSM_N> const&, Tensor<SEngine, SLayout> const& src,
                        Tensor<DEngine, DLayout>& dst) {
  Tensor rS = recast<uint128_t const>(src);
  Tensor rD = recast<uint32_t>(dst);
  static_assert(decltype(size(rS))::value == 1 && decltype(size(rD))::value == 4);
  emu::sm80::ldmatrix_x4(raw_pointer_cast(&rS(0)), rD(0), rD(1), rD(2), rD(3));
}
template <class SEngine, class SLayout, class DEngine, class DLayout>
inline void copy_unpack(Copy_Traits<SM75_U32x4_LDSM_N> const& t, Tensor<SEngine, SLayout> const& src,
                        Tensor<DEngine, DLayout>&& dst) {
  copy_unpack(t, src, dst);
}

namespace emu_detail {
template <class Elem, class TD, class DL, class TA, class AL, class TB, class BL, class TC, class CL>
inline void mma_16816(Tensor<TD, DL>& D, Tensor<TA, AL> const& A, Tensor<TB, BL> const& B, Tensor<TC, CL> const& C) {
  Tensor rA = recast<uint32_t>(A);
  Tensor rB = recast<uint32_t>(B);
  Tensor rC = recast<float>(C);
  Tensor rD = recast<float>(D);
  static_assert(decltype(size(rA))::value == 4 && decltype(size(rB))::value == 2);
  static_assert(decltype(size(rC))::value == 4 && decltype(size(rD))::value == 4);
  const uint32_t a[4] = {rA(0), rA(1), rA(2), rA(3)}, b[2] = {rB(0), rB(1)};
  const float c[4] = {rC(0), rC(1), rC(2), rC(3)};
  float d[4];
  emu::sm80::mma_m16n8k16<Elem>(d, a, b, c);
  for (int i = 0; i < 4; ++i) rD(i) = d[i];
}
}  // namespace emu_detail

template <class TD, class DL, class TA, class AL, class TB, class BL, class TC, class CL>
inline void mma_unpack(MMA_Traits<SM80_16x8x16_F32BF16BF16F32_TN> const&, Tensor<TD, DL>& D, Tensor<TA, AL> const& A,
                       Tensor<TB, BL> const& B, Tensor<TC, CL> const& C) {
  emu_detail::mma_16816<bfloat16_t>(D, A, B, C);
}
template <class TD, class DL, class TA, class AL, class TB, class BL, class TC, class CL>
inline void mma_unpack(MMA_Traits<SM80_16x8x16_F32F16F16F32_TN> const&, Tensor<TD, DL>& D, Tensor<TA, AL> const& A,
                       Tensor<TB, BL> const& B, Tensor<TC, CL> const& C) {
  emu_detail::mma_16816<half_t>(D, A, B, C);
}

}  // namespace cute
