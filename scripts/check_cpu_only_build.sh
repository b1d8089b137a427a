#!/usr/bin/env bash
# Builds dcoco as a machine without CUDA would (AUTO with no CUDA compiler to be found) and checks that the
# result imports, says it has no CUDA, and matches the reference. Uses .venv from scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
CUDACXX=/nonexistent/nvcc DCOCO_CUDA=AUTO .venv/bin/python -m pip wheel -v --no-build-isolation --no-deps \
  -Cbuild-dir="$out/build" -w "$out/wheel" . >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
# the one line a CPU-only build prints (pip shows it with -v)
grep -A1 "dcoco: the CUDA kernel was not built" "$out/build.log" || { echo "no CPU-only build message"; exit 1; }
.venv/bin/python -m pip install -q --no-deps --target "$out/site" "$out"/wheel/dcoco-*.whl
cd "$out" && PYTHONPATH="$out/site" "$OLDPWD/.venv/bin/python" - <<'PY'
import torch, dcoco
from dcoco import reference as ref
info = dcoco.build_info()
assert not info["built_with_cuda"] and not dcoco.cuda_available(), info
assert dcoco.__file__.startswith(__import__("os").getcwd()), dcoco.__file__  # the CPU-only wheel, not .venv's
g = torch.Generator().manual_seed(0)
m = dcoco.Corrector(64, num_candidates=4)
torch.nn.init.normal_(m.mlp[2].weight, generator=g)
h, E = torch.randn(2, 5, 64, generator=g), torch.randn(50, 64, generator=g)
ids, lg = torch.randint(0, 50, (2, 5, 4), generator=g), torch.randn(2, 5, 4, generator=g)
s = m.score(h, ids, lg, E)
torch.testing.assert_close(s.double(), ref.score(h.double(), ids, lg.double(), E.double(), *(w.double() for w in m.weights())),
                           rtol=1e-5, atol=1e-5)
assert info["cuda_archs"] == [] and "nvcc was not found" in info["devices"].get("cuda:0", {"why": "nvcc was not found"})["why"]
assert dcoco.backend.decide("auto", "cuda", "sm_90", info["built_with_cuda"])[0] == "native"  # GPU tensors: native
with dcoco.use_backend("native"):
    torch.testing.assert_close(m.score(h, ids, lg, E), s, rtol=1e-5, atol=1e-5)
print("CPU-only build OK:", info["cuda_status"])
PY
