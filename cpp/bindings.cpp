// pybind11 only: integers (data pointers), shapes and dtype codes in; results through the pointers.
// No torch here: the Python layer (dcoco/ops/fused.py) checks arguments and allocates every output.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dcoco/api.h"
#include "dcoco/dispatch.h"
#include "dcoco/math.h"

namespace py = pybind11;
using namespace dcoco;

namespace {

template <class T>
const T* ptr(uintptr_t a) {
  return reinterpret_cast<const T*>(a);
}

template <class T = float>
WeightsOf<T> weights_from(const std::vector<uintptr_t>& a) {
  if (a.empty()) return {};
  if (a.size() != 10) throw std::invalid_argument("weights: expected 10 pointers");
  return {ptr<T>(a[0]), ptr<T>(a[1]), ptr<T>(a[2]), ptr<T>(a[3]), ptr<T>(a[4]),
          ptr<T>(a[5]), ptr<T>(a[6]), ptr<T>(a[7]), ptr<T>(a[8]), ptr<T>(a[9])};
}

template <class T>
WeightGradsOf<T> weight_grads_from(const std::vector<uintptr_t>& a) {
  if (a.empty()) return {};
  if (a.size() != 10) throw std::invalid_argument("d_weights: expected 10 pointers");
  auto out = [&](int i) { return reinterpret_cast<T*>(a[i]); };
  return {out(0), out(1), out(2), out(3), out(4), out(5), out(6), out(7), out(8), out(9)};
}

// The dtype and rule codes Python passes, checked against the enums (exported as _C.DType and _C.Rule).
DType float_dtype(int code, const char* name) {
  const auto t = DType(code);
  if (t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64) return t;
  throw std::invalid_argument(std::string(name) + ": expected the code of a float dtype (dcoco._C.DType float32, " +
                              "bfloat16, float16 or float64), got " + std::to_string(code));
}

DType id_dtype(int code, const char* name) {
  const auto t = DType(code);
  if (t == DType::i32 || t == DType::i64) return t;
  throw std::invalid_argument(std::string(name) + ": expected the code of an id dtype (dcoco._C.DType int32 or " +
                              "int64), got " + std::to_string(code));
}

Rule rule_of(int code) {
  if (code >= int(Rule::greedy) && code <= int(Rule::geometric)) return Rule(code);
  throw std::invalid_argument("rule: expected a dcoco._C.Rule code (greedy, global or geometric), got " +
                              std::to_string(code));
}

// Sizes (R, B, K, d, V, r, H) into p.
template <class Params>
void set_sizes(Params& p, const std::vector<int64_t>& sizes) {
  if (sizes.size() != 7) throw std::invalid_argument("sizes: expected (R, B, K, d, V, r, H)");
  p.R = sizes[0], p.B = sizes[1], p.K = sizes[2], p.d = sizes[3], p.V = sizes[4], p.r = sizes[5], p.H = sizes[6];
}

// The corrector's inputs, shared by ForwardParams and GradParams: sizes, then (pointer, dtype code) pairs.
template <class Params>
void set_inputs(Params& p, const std::vector<int64_t>& sizes, uintptr_t hidden, int hidden_dtype, uintptr_t ids,
                int ids_dtype, uintptr_t logits, int logits_dtype, uintptr_t embed, int embed_dtype) {
  set_sizes(p, sizes);
  p.hidden = ptr<void>(hidden), p.hidden_dtype = float_dtype(hidden_dtype, "hidden_dtype");
  p.cand_ids = ptr<void>(ids), p.ids_dtype = id_dtype(ids_dtype, "ids_dtype");
  p.cand_logits = ptr<void>(logits), p.logits_dtype = float_dtype(logits_dtype, "logits_dtype");
  p.embed = ptr<void>(embed), p.embed_dtype = float_dtype(embed_dtype, "embed_dtype");
}

// The training path's params in precision T.
template <class T>
GradParams<T> grad_params(const std::vector<int64_t>& sizes, uintptr_t hidden, int hidden_dtype, uintptr_t ids,
                          int ids_dtype, uintptr_t logits, int logits_dtype, uintptr_t embed, int embed_dtype,
                          const std::vector<uintptr_t>& weights, uintptr_t grad, uintptr_t scores, uintptr_t d_hidden,
                          uintptr_t d_logits, const std::vector<uintptr_t>& d_weights) {
  GradParams<T> p;
  set_inputs(p, sizes, hidden, hidden_dtype, ids, ids_dtype, logits, logits_dtype, embed, embed_dtype);
  p.w = weights_from<T>(weights);
  p.grad = ptr<T>(grad);
  p.scores = reinterpret_cast<T*>(scores);
  p.d_hidden = reinterpret_cast<T*>(d_hidden);
  p.d_logits = reinterpret_cast<T*>(d_logits);
  p.d_w = weight_grads_from<T>(d_weights);
  return p;
}

ForwardParams forward_params(const std::vector<int64_t>& sizes, uintptr_t hidden, int hidden_dtype, uintptr_t ids,
                             int ids_dtype, uintptr_t logits, int logits_dtype, uintptr_t embed, int embed_dtype,
                             uintptr_t table, const std::vector<uintptr_t>& weights, uintptr_t scores,
                             uintptr_t ranks, uintptr_t tokens) {
  ForwardParams p;
  set_inputs(p, sizes, hidden, hidden_dtype, ids, ids_dtype, logits, logits_dtype, embed, embed_dtype);
  p.table = ptr<float>(table);
  p.w = weights_from(weights);
  p.scores = reinterpret_cast<float*>(scores);
  p.ranks = reinterpret_cast<int64_t*>(ranks);
  p.tokens = reinterpret_cast<int64_t*>(tokens);
  return p;
}

template <class Params>
void run(const Params& p, bool cuda, void (*on_cpu)(const Params&), void (*on_cuda)(const Params&)) {
  py::gil_scoped_release nogil;
  (cuda ? on_cuda : on_cpu)(p);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dcoco compiled core (torch-free)";
  m.attr("MAX_CANDIDATES") = kMaxCandidates;
  // the codes of the dtype and rule arguments, named as Python names them (dcoco.ops.fused checks its own at import)
  py::enum_<DType>(m, "DType")
      .value("float32", DType::f32)
      .value("bfloat16", DType::bf16)
      .value("float16", DType::f16)
      .value("int32", DType::i32)
      .value("int64", DType::i64)
      .value("float64", DType::f64);
  py::enum_<Rule>(m, "Rule")
      .value("greedy", Rule::greedy)
      .value("global", Rule::global)
      .value("geometric", Rule::geometric);
  m.attr("built_with_cuda") = cuda::built();
  m.attr("cutlass_version") = cuda::cutlass_version();
#ifdef DCOCO_CUDA_ARCHS_BUILT
  m.attr("cuda_archs") = DCOCO_CUDA_ARCHS_BUILT;  // e.g. "80,90a,100a" (DCOCO_CUDA_ARCHS)
#else
  m.attr("cuda_archs") = "";
#endif
  m.def("cuda_status", &cuda::status, "(device count, message); never raises");
  m.def("cuda_path", &cuda::cuda_path, "the fused kernel's arch path on the current CUDA device");
  m.def(
      "pick_cuda_path",
      [](int major, int minor, std::optional<int> ptx, const std::string& built, const std::string& force)
          -> std::optional<std::string> {
        const auto best = best_path(major, minor, ptx, built);
        if (!best) return std::nullopt;
        return arch_name(chosen_path(*best, force.c_str(), "sm_" + std::to_string(major) + std::to_string(minor)));
      },
      "The dispatch rule alone (dcoco/dispatch.h), for tests: the path for a device of compute capability "
      "major.minor whose loaded image has virtual arch ptx (None: no image), for a build of archs built "
      "(e.g. '80,90a,100a') and a DCOCO_CUDA_PATH value; None when nothing can run.",
      py::arg("major"), py::arg("minor"), py::arg("ptx"), py::arg("built"), py::arg("force") = "");

  // Each op runs on the CPU, or with cuda=True on the given stream; the GIL is released while it runs.
  m.def(
      "score_grad",
      [](std::vector<int64_t> sizes, uintptr_t hidden, int hidden_dtype, uintptr_t ids, int ids_dtype,
         uintptr_t logits, int logits_dtype, uintptr_t embed, int embed_dtype, std::vector<uintptr_t> weights,
         uintptr_t grad, uintptr_t scores, uintptr_t d_hidden, uintptr_t d_logits, std::vector<uintptr_t> d_weights,
         bool float64, bool cuda, uintptr_t stream, uintptr_t workspace) {
        if (float64) {
          if (cuda) throw std::invalid_argument("hidden: float64 runs on the CPU only");
          const auto p = grad_params<double>(sizes, hidden, hidden_dtype, ids, ids_dtype, logits, logits_dtype, embed,
                                             embed_dtype, weights, grad, scores, d_hidden, d_logits, d_weights);
          py::gil_scoped_release nogil;
          cpu::score_grad(p);
          return;
        }
        auto p = grad_params<float>(sizes, hidden, hidden_dtype, ids, ids_dtype, logits, logits_dtype, embed,
                                    embed_dtype, weights, grad, scores, d_hidden, d_logits, d_weights);
        p.workspace = reinterpret_cast<float*>(workspace);
        p.stream = reinterpret_cast<void*>(stream);
        run(p, cuda, cpu::score_grad, cuda::score_grad);
      },
      "the training path: scores and/or gradients (GradParams); float64 on the CPU only",
      py::arg("sizes"), py::arg("hidden"), py::arg("hidden_dtype"), py::arg("cand_ids"), py::arg("ids_dtype"),
      py::arg("cand_logits"), py::arg("logits_dtype"), py::arg("embed"), py::arg("embed_dtype"), py::arg("weights"),
      py::arg("grad"), py::arg("scores"), py::arg("d_hidden"), py::arg("d_logits"), py::arg("d_weights"),
      py::arg("float64"), py::arg("cuda") = false, py::arg("stream") = 0, py::arg("workspace") = 0);
  m.def(
      "cuda_grad_workspace_size",
      [](std::vector<int64_t> sizes) {
        GradParams<float> p;
        set_sizes(p, sizes);
        return cuda::grad_workspace_size(p);
      },
      py::arg("sizes"));
  m.def(
      "forward",
      [](std::vector<int64_t> sizes, uintptr_t hidden, int hidden_dtype, uintptr_t ids, int ids_dtype,
         uintptr_t logits, int logits_dtype, uintptr_t embed, int embed_dtype, uintptr_t table,
         std::vector<uintptr_t> weights, uintptr_t scores, uintptr_t ranks, uintptr_t tokens, bool cuda,
         uintptr_t stream, uintptr_t workspace, uintptr_t counters) {
        ForwardParams p = forward_params(sizes, hidden, hidden_dtype, ids, ids_dtype, logits, logits_dtype, embed,
                                         embed_dtype, table, weights, scores, ranks, tokens);
        p.workspace = reinterpret_cast<float*>(workspace);
        p.counters = reinterpret_cast<int32_t*>(counters);
        p.stream = reinterpret_cast<void*>(stream);
        run(p, cuda, cpu::forward, cuda::forward);
      },
      py::arg("sizes"), py::arg("hidden"), py::arg("hidden_dtype"), py::arg("cand_ids"), py::arg("ids_dtype"),
      py::arg("cand_logits"), py::arg("logits_dtype"), py::arg("embed"), py::arg("embed_dtype"), py::arg("table"),
      py::arg("weights"), py::arg("scores"), py::arg("ranks"), py::arg("tokens"), py::arg("cuda") = false,
      py::arg("stream") = 0, py::arg("workspace") = 0, py::arg("counters") = 0);
  m.def(
      "cuda_workspace_sizes",
      [](std::vector<int64_t> sizes, bool table, bool scores) {
        ForwardParams p;  // the plan reads the sizes and which outputs and inputs are given, no data
        set_sizes(p, sizes);
        p.table = table ? ptr<float>(1) : nullptr;
        p.scores = scores ? reinterpret_cast<float*>(1) : nullptr;
        return cuda::workspace_sizes(p);
      },
      py::arg("sizes"), py::arg("table"), py::arg("scores"));
  m.def(
      "cand_table",
      [](int64_t V, int64_t d, int64_t r, uintptr_t embed, int embed_dtype, uintptr_t cand_proj, uintptr_t fuse_proj,
         uintptr_t table, bool cuda, uintptr_t stream) {
        CandTableParams p;
        p.V = V, p.d = d, p.r = r;
        p.embed = ptr<void>(embed), p.embed_dtype = float_dtype(embed_dtype, "embed_dtype");
        p.cand_proj = ptr<float>(cand_proj), p.fuse_proj = ptr<float>(fuse_proj);
        p.table = reinterpret_cast<float*>(table);
        p.stream = reinterpret_cast<void*>(stream);
        run(p, cuda, cpu::cand_table, cuda::cand_table);
      },
      py::arg("V"), py::arg("d"), py::arg("r"), py::arg("embed"), py::arg("embed_dtype"), py::arg("cand_proj"),
      py::arg("fuse_proj"), py::arg("table"), py::arg("cuda") = false, py::arg("stream") = 0);
  m.def(
      "select",
      [](int64_t R, int64_t B, int64_t K, uintptr_t scores, uintptr_t first, int first_dtype, int rule, float lam,
         uintptr_t work, uintptr_t next, uintptr_t ranks, bool cuda, uintptr_t stream) {
        SelectParams p;
        p.R = R, p.B = B, p.K = K;
        p.scores = ptr<float>(scores);
        p.first_logits = ptr<void>(first), p.first_dtype = float_dtype(first_dtype, "first_dtype");
        p.rule = rule_of(rule), p.lam = lam;
        p.work = reinterpret_cast<float*>(work);
        p.next = reinterpret_cast<int32_t*>(next);
        p.ranks = reinterpret_cast<int64_t*>(ranks);
        p.stream = reinterpret_cast<void*>(stream);
        run(p, cuda, cpu::select, cuda::select);
      },
      py::arg("R"), py::arg("B"), py::arg("K"), py::arg("scores"), py::arg("first_logits"), py::arg("first_dtype"),
      py::arg("rule"), py::arg("lam"), py::arg("work"), py::arg("next"), py::arg("ranks"), py::arg("cuda") = false,
      py::arg("stream") = 0);

  m.def("gelu", [](float x) { return gelu(x); }, "the shared GELU (dcoco/math.h), for tests");
  m.def(
      "layer_norm",
      [](std::vector<float> x, std::vector<float> gamma, std::vector<float> beta) {
        if (!gamma.empty() && (gamma.size() != x.size() || beta.size() != x.size()))
          throw std::invalid_argument("gamma, beta: expected the length of x or empty");
        layer_norm(x.data(), int(x.size()), gamma.empty() ? nullptr : gamma.data(), beta.empty() ? nullptr : beta.data());
        return x;
      },
      py::arg("x"), py::arg("gamma") = std::vector<float>{}, py::arg("beta") = std::vector<float>{},
      "the shared LayerNorm (dcoco/math.h), for tests");
}
