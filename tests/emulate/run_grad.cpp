// Runs the CUDA backward (cuda/score_grad.cuh) under tests/emulate/cuda_emulation.h on inputs written by
// tests/test_grad.py (run_correct.cpp's layout plus grad.bin); writes the gradients there.
#include "cuda_emulation.h"
// the emulation header must come first: it defines the CUDA keywords the kernels use
#define DCOCO_DYNAMIC_SMEM(name) alignas(1024) static thread_local char name[1 << 16]
#include "score_grad.cuh"

#include <fstream>
#include <string>
#include <vector>

using namespace dcoco;

static std::vector<char> read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

static void write(const std::string& path, const std::vector<float>& x) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(x.data()), std::streamsize(x.size() * 4));
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  std::ifstream meta(dir + "/meta.txt");
  GradParams<float> p;
  int hd, idd, ld, ed;
  meta >> p.R >> p.B >> p.K >> p.d >> p.V >> p.r >> p.H >> hd >> idd >> ld >> ed;
  p.hidden_dtype = DType(hd), p.ids_dtype = DType(idd), p.logits_dtype = DType(ld), p.embed_dtype = DType(ed);
  auto hidden = read(dir + "/hidden.bin"), ids = read(dir + "/ids.bin"), logits = read(dir + "/logits.bin"),
       embed = read(dir + "/embed.bin"), grad = read(dir + "/grad.bin");
  std::vector<std::vector<char>> w;
  for (int i = 0; i < 10; ++i) w.push_back(read(dir + "/w" + std::to_string(i) + ".bin"));
  p.hidden = hidden.data(), p.cand_ids = ids.data(), p.cand_logits = logits.data(), p.embed = embed.data();
  const float* wp[10];
  for (int i = 0; i < 10; ++i) wp[i] = reinterpret_cast<const float*>(w[i].data());
  p.w = {wp[0], wp[1], wp[2], wp[3], wp[4], wp[5], wp[6], wp[7], wp[8], wp[9]};
  p.grad = reinterpret_cast<const float*>(grad.data());
  const float nan = __int_as_float(0x7fc00000);  // outputs and workspace poisoned
  const int64_t S = p.R * p.B, r = p.r, H = p.H, d = p.d;
  std::vector<float> d_hidden(S * d, nan), d_logits(S * p.K, nan);
  const int64_t wsize[10] = {r * d, r * d, 2 * r * r, r, r, 2 * r * d, H * (3 * r + 2), H, H, 1};
  std::vector<std::vector<float>> d_w;
  for (int i = 0; i < 10; ++i) d_w.emplace_back(wsize[i], nan), p.d_w[i] = d_w[i].data();
  p.d_hidden = d_hidden.data(), p.d_logits = d_logits.data();
  const cuda::GradPlan l = cuda::grad_plan_of(p);
  std::vector<float> workspace(l.floats, nan);
  p.workspace = workspace.data();
  // the launch sequence of cuda/grad.cu
  const dim3 block(cuda::kThreads);
  emu::launch(dim3(unsigned(l.S)), block, [&] { cuda::grad_forward_kernel(p); });
  emu::launch(dim3(unsigned(l.Tn)), block, [&] { cuda::grad_transition_kernel(p); });
  emu::launch(dim3(unsigned(l.S)), block, [&] { cuda::grad_slot_kernel(p); });
  cuda::OuterSum sums[cuda::kOuterSums];
  cuda::outer_sums(p, sums);
  for (const auto& o : sums)
    emu::launch(dim3(unsigned(cuda::cdiv(o.N * o.Kd, cuda::kThreads))), block, [&] { cuda::outer_sum_kernel(o, p); });
  emu::launch(dim3(unsigned(cuda::cdiv(r + H + 1, cuda::kThreads))), block, [&] { cuda::column_sum_kernel(p); });
  write(dir + "/d_hidden.bin", d_hidden);
  write(dir + "/d_logits.bin", d_logits);
  for (int i = 0; i < 10; ++i) write(dir + "/d_w" + std::to_string(i) + ".bin", d_w[i]);
  return 0;
}
