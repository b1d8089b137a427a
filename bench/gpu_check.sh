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
#
# Rehearsal on a CPU machine, so that a typo cannot waste a lent device: `bash bench/gpu_check.sh --rehearse`
# runs every step with .venv's python, a CPU-only build, the device "cpu", compute-sanitizer replaced by a shim that
# runs the command bare, and the GPU timings only imported; it ends with the report (whose "passed" is false: no
# GPU ran). CI runs it (scripts/rehearse_gpu_check.sh).
set -uo pipefail
rehearse=0
[ "${1:-}" = "--rehearse" ] && rehearse=1
OUT=${OUT:-/tmp/gpu_check}
W=/tmp/gpu_work  # everything but the report, the summary and the logs stays here (8 files come back from $OUT)
rm -rf "$W"
mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
dev=cuda cuda=ON build_s=150 fused_steps=50 native_steps=20
if [ $rehearse = 1 ]; then  # a 2-core CPU machine: a slower build, and few training steps inside the same timeouts
  dev=cpu cuda=OFF build_s=600 fused_steps=8 native_steps=8
  mkdir -p "$W/bin"
  printf '#!/usr/bin/env bash\nexec "%s/.venv/bin/python3" "$@"\n' "$PWD" >"$W/bin/python3"  # a link would lose the venv
  printf '#!/usr/bin/env bash\n# compute-sanitizer --tool T --error-exitcode N cmd...: the rehearsal runs cmd bare\nshift 4; exec "$@"\n' \
    >"$W/bin/compute-sanitizer"
  chmod +x "$W/bin/compute-sanitizer" "$W/bin/python3"
  export PATH="$W/bin:$PATH"
  log "rehearsal: CPU only, GPU steps stubbed"
fi

python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/nvidia_cutlass-*.whl || exit 1
export PYTHONPATH=/tmp/site
arch=90a  # the rehearsal's stand-in
[ $rehearse = 1 ] || arch=$(python3 -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}a' if a >= 9 else f'{a}{b}')")
log "building for $arch"
start=$SECONDS
DCOCO_CUDA=$cuda DCOCO_CUDA_ARCHS="$arch" timeout $build_s python3 -m pip install -q --no-build-isolation --no-deps \
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
dev = "cuda" if torch.cuda.is_available() else "cpu"
c = make_case(2, 15, 16, 256, V=500, dtype=torch.bfloat16, seed=0); c.corrector.to(dev)
x = [t.to(dev) for t in c.inputs]; h = x[0].float().requires_grad_()
c.corrector.score(h, *x[1:]).sum().backward(); c.corrector(*x); c.corrector.prepare_inference(x[3]); c.corrector(*x)
torch.cuda.synchronize() if dev == "cuda" else None; print("small case ok on", dev)'
for tool in memcheck racecheck synccheck; do
  timeout 40 compute-sanitizer --tool $tool --error-exitcode 3 python3 -c "$small" >"$W/sanitizer_$tool.log" 2>&1
  echo $? >"$W/sanitizer_$tool.rc"
  log "compute-sanitizer $tool: exit $(cat "$W/sanitizer_$tool.rc")"
done

# 4. training smoke, each backend: fused with the target's features captured online (the default on CUDA) and
#    gradient checkpointing, 50 steps; native from a feature cache
for b in fused native; do
  case $b in fused) how="--steps $fused_steps --features online --grad-checkpoint" ;; *) how="--steps $native_steps --features cache" ;; esac
  DCOCO_BACKEND=$b timeout 45 python3 bench/gpu_train_smoke.py --device $dev $how 2>"$W/train_$b.err" \
    | tail -1 >"$W/train_$b.json"
  log "train smoke ($b): $(cat "$W/train_$b.json")"
done

# 5. timings
if [ $rehearse = 1 ]; then
  python3 -c "import runpy, sys; sys.argv = ['gpu_bench.py', '--help']; runpy.run_path('bench/gpu_bench.py', run_name='__main__')" \
    >"$OUT/bench.log" 2>&1
  log "timings: rehearsal, bench/gpu_bench.py imported only (exit $?)"
else
  timeout 60 python3 bench/gpu_bench.py --out "$W" 2>&1 | tee "$OUT/bench.log" | tail -16
fi

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
