#!/usr/bin/env bash
# The one prepared device call: 8.5 minutes at most without vLLM on the image, 10 with it (each step has a
# timeout, and the vLLM step starts only within the first 7 minutes; never run yet). On the lent GPU it:
#   1. builds dcoco for the GPU's arch (CUTLASS from the carried wheel);
#   2. runs tests/test_cuda.py + test_select.py on CUDA under both backends, against the literal reference
#      (every fused kernel path, CUDA-graph capture and replay of both backends, backward);
#   3. runs compute-sanitizer memcheck, racecheck and synccheck on a small fused case;
#   4. runs `dcoco train --mode joint` on a tiny random target under each backend: fused with online features
#      and gradient checkpointing (50 steps), native from a feature cache (20 steps);
#   5. times fused vs native vs the reference (bench/gpu_bench.py);
#   6. if vLLM is on the device image: serves a tiny target with a tiny DCOCO drafter on vLLM's GPU runner, CUDA
#      graphs on; greedy output must equal no speculation, and the corrector must have drafted
#      (bench/gpu_vllm_smoke.py); skipped, and said so, without vLLM;
#   7. writes $OUT/<gpu>-<date>.json (bench/gpu_report.py). Commit it as bench/results/gpu/<gpu>-<date>.json:
#      its "passed" (every fused check green) is what may put its arch into backend.VALIDATED_CUDA_ARCHS.
# From the session:  run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=600)
# where .whl/ holds nvidia_cutlass-4.2.0.0-py3-none-any.whl (pip download --no-deps nvidia-cutlass==4.2.0.0 -d .whl).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
W=/tmp/gpu_work  # everything but the report, the summary and the logs stays here (8 files come back from $OUT)
mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/nvidia_cutlass-*.whl || exit 1
export PYTHONPATH=/tmp/site
arch=$(python3 -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}a' if a >= 9 else f'{a}{b}')")
log "building for $arch"
start=$SECONDS
DCOCO_CUDA=ON DCOCO_CUDA_ARCHS="$arch" timeout 150 python3 -m pip install -q --no-build-isolation --no-deps \
  --target /tmp/dcoco . >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/dcoco:/tmp/site
log "built in $((SECONDS - start)) s: $(python3 -c 'import dcoco, json; print(json.dumps(dcoco.build_info()))')"

# 2. both backends against the reference (each_backend runs every test under fused and native)
timeout 90 python3 -m pytest -q -p no:cacheprovider --junitxml="$W/junit.xml" tests/test_cuda.py tests/test_select.py \
  2>&1 | tee "$OUT/tests.log" | tail -15
log "tests: $(tail -1 "$OUT/tests.log")"

# 3. the fused kernel under compute-sanitizer
small='import torch, dcoco, sys; sys.path.insert(0, "tests"); from conftest import make_case
dcoco.set_backend("fused")
c = make_case(2, 15, 16, 256, V=500, dtype=torch.bfloat16, seed=0); c.corrector.cuda()
x = [t.cuda() for t in c.inputs]; h = x[0].float().requires_grad_()
c.corrector.score(h, *x[1:]).sum().backward(); c.corrector(*x); c.corrector.prepare_inference(x[3]); c.corrector(*x)
torch.cuda.synchronize(); print("small case ok")'
for tool in memcheck racecheck synccheck; do
  timeout 40 compute-sanitizer --tool $tool --error-exitcode 3 python3 -c "$small" >"$W/sanitizer_$tool.log" 2>&1
  echo $? >"$W/sanitizer_$tool.rc"
  log "compute-sanitizer $tool: exit $(cat "$W/sanitizer_$tool.rc")"
done

# 4. training smoke, each backend: fused with the target's features captured online (the default on CUDA) and
#    gradient checkpointing, 50 steps; native from a feature cache
for b in fused native; do
  case $b in fused) how="--steps 50 --features online --grad-checkpoint" ;; *) how="--steps 20 --features cache" ;; esac
  DCOCO_BACKEND=$b timeout 45 python3 bench/gpu_train_smoke.py --device cuda $how 2>"$W/train_$b.err" \
    | tail -1 >"$W/train_$b.json"
  log "train smoke ($b): $(cat "$W/train_$b.json")"
done

# 5. timings
timeout 60 python3 bench/gpu_bench.py --out "$W" 2>&1 | tee "$OUT/bench.log" | tail -16

# 6. the plugin on vLLM's GPU runner, when the image has vLLM (nothing can be installed there: no network)
if [ $SECONDS -gt 420 ]; then  # the report below must make it inside the device call's 600 s
  log "vllm: skipped, $SECONDS s spent and the report must be written"
elif python3 -c "import vllm" 2>/dev/null; then
  for what in plain dcoco; do
    timeout 75 python3 bench/gpu_vllm_smoke.py "$W" $what >"$W/vllm_$what.log" 2>&1 || tail -5 "$W/vllm_$what.log"
  done
  log "vllm: $(cat "$W/vllm.json" 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["vllm"], "passed", r["passed"])' 2>/dev/null || echo failed, see vllm_dcoco.log)"
else
  log "vllm: not on this image, step skipped"
fi

# 7. the one JSON to commit
python3 bench/gpu_report.py "$W" "$OUT" | tee -a "$OUT/summary.txt"
