#!/usr/bin/env bash
# Checks that each arch path of the fused forward really emits its tensor-core instructions: PTX of
# cuda/forward.cu per target must contain mma.sync (sm_80), wgmma (sm_90a) and tcgen05.mma with its
# tcgen05.wait::ld (sm_100a).
# No GPU needed. Uses .venv from scripts/setup.sh (CUTLASS headers) when present.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || { echo "no nvcc: arch paths not checked"; exit 0; }
PY=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )
cutlass=$("$PY" -c "import cutlass_library, os; print(os.path.join(cutlass_library.source_path, 'include'))")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ptx() {  # arch: its PTX of cuda/forward.cu
  nvcc -std=c++17 --expt-relaxed-constexpr -ptx -arch="compute_$1" -Icpp/include -isystem "$cutlass" \
    -DDCOCO_CUDA_ARCHS_BUILT="\"$1\"" cuda/forward.cu -o "$out/$1.ptx"
}
check() {  # arch, instruction that must appear
  local n
  n=$(grep -c "$2" "$out/$1.ptx" || true)
  [ "$n" -gt 0 ] || { echo "sm_$1: no '$2' in the PTX"; exit 1; }
  echo "sm_$1: $n '$2' instructions"
}
# the three compiles side by side (each is one nvcc process): about half the time on CI's 2 cores
pids=()
for arch in 80 90a 100a; do ptx "$arch" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid"; done
check 80 "mma.sync.aligned.m16n8k16"
check 90a "wgmma.mma_async"
check 100a "tcgen05.mma"
check 100a "tcgen05.wait::ld"  # the accumulators are read only after their tcgen05.ld completes
