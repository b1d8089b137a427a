// The emulated runners' shared input: the folder tests/ops/test_cuda_emulated.py writes (meta.txt with sizes
// and dtype codes, raw .bin arrays), loaded into ForwardParams or GradParams<float>.
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include "dcoco/params.h"

inline std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

template <class T>
void write_file(const std::string& path, const T* data, size_t n) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data), std::streamsize(n * sizeof(T)));
}

// Owns the arrays p points into; meta is left positioned after the dtype codes for runner-specific fields.
struct Inputs {
  std::ifstream meta;
  std::vector<char> hidden, ids, logits, embed;
  std::vector<std::vector<char>> w;

  template <class Params>
  Inputs(const std::string& dir, Params& p) : meta(dir + "/meta.txt") {
    int hd, idd, ld, ed;
    meta >> p.R >> p.B >> p.K >> p.d >> p.V >> p.r >> p.H >> hd >> idd >> ld >> ed;
    p.hidden_dtype = dcoco::DType(hd), p.ids_dtype = dcoco::DType(idd), p.logits_dtype = dcoco::DType(ld),
    p.embed_dtype = dcoco::DType(ed);
    hidden = read_file(dir + "/hidden.bin"), ids = read_file(dir + "/ids.bin"), logits = read_file(dir + "/logits.bin");
    embed = read_file(dir + "/embed.bin");
    for (int i = 0; i < 10; ++i) w.push_back(read_file(dir + "/w" + std::to_string(i) + ".bin"));
    p.hidden = hidden.data(), p.cand_ids = ids.data(), p.cand_logits = logits.data(), p.embed = embed.data();
    auto f = [&](int i) { return reinterpret_cast<const float*>(w[i].data()); };
    p.w = {f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7), f(8), f(9)};
  }
};
