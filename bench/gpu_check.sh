#!/usr/bin/env bash
# The one prepared device call: build for the lent GPU, test the CUDA path against the reference, run
# compute-sanitizer (memcheck, racecheck) on a small case, and time the fused op. Output under $OUT.
# From the session:  run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=480)
# where .whl/ holds nvidia_cutlass-4.2.0.0-py3-none-any.whl (pip download --no-deps nvidia-cutlass==4.2.0.0 -d .whl).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DCOCO_UNVALIDATED_CUDA=1
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/nvidia_cutlass-*.whl || exit 1
export PYTHONPATH=/tmp/site
arch=$(python3 -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}a' if a >= 9 else f'{a}{b}')")
log "building for $arch"
start=$SECONDS
DCOCO_CUDA=ON DCOCO_CUDA_ARCHS="$arch" python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/dcoco . \
  >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/dcoco:/tmp/site
log "built in $((SECONDS - start)) s: $(python3 -c 'import dcoco, json; print(json.dumps(dcoco.build_info()))')"

# every kernel path the GPU can run (DCOCO_CUDA_PATH: simt, sm80, sm90 or sm100) against the reference
python3 -m pytest -x -q -p no:cacheprovider tests/test_cuda.py tests/test_select.py 2>&1 | tee "$OUT/tests.log" | tail -15
log "tests: $(tail -1 "$OUT/tests.log")"

small='import os, torch, dcoco, sys; sys.path.insert(0, "tests"); from conftest import make_case
c = make_case(2, 15, 16, 256, V=500, dtype=torch.bfloat16, seed=0); c.corrector.cuda()
x = [t.cuda() for t in c.inputs]; c.corrector.score(*x); c.corrector(*x); c.corrector.prepare_inference(x[3]); c.corrector(*x)
torch.cuda.synchronize(); print("small case ok")'
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 3 python3 -c "$small" >"$OUT/sanitizer_$tool.log" 2>&1
  log "compute-sanitizer $tool: exit $? ($(grep -c -i 'error' "$OUT/sanitizer_$tool.log") lines mention errors)"
done

python3 bench/gpu_bench.py --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -14
log "bench: $OUT/gpu_bench.json"
cat "$OUT/summary.txt"
