#!/usr/bin/env bash
# dcoco's drafters in llama.cpp: builds llama-server (scripts/build_llamacpp.sh), then checks `dcoco export --format
# gguf` against llama.cpp's own converter and serves the exported drafter with llama-server
# (tests/serve/test_llamacpp.py). Its output goes to bench/results/llamacpp/test_llamacpp.log.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
bash scripts/build_llamacpp.sh
# the converter reads SmolLM2's tokenizer with sentencepiece (llama.cpp's requirements-convert_hf_to_gguf.txt)
[ -d build/llama.cpp/py/sentencepiece ] || .venv/bin/python -m pip install -q --target build/llama.cpp/py sentencepiece
.venv/bin/python -m pytest tests/serve/test_llamacpp.py -v -s --no-header -p no:cacheprovider "$@" 2>&1 \
  | tee bench/results/llamacpp/test_llamacpp.log
exit "${PIPESTATUS[0]}"
