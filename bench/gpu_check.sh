#!/usr/bin/env bash
# The one prepared device call: at most LIMIT s of device time, counted as START (the machine's start and the
# transfers, before the command runs) plus every step's timeout below. Steps run in order of value, each under its
# own timeout, and each writes its result to $OUT when it ends, so a call cut off still returns what finished; the
# report at the end summarises whatever exists. `bash bench/gpu_check.sh --plan` prints this plan as JSON, and the
# CPU rehearsal fails when START + the steps' sum exceeds LIMIT.
LIMIT=365 START=60
STEPS=(wheel build env tests hook sanitizer bench report)
declare -A T=(
  [wheel]=5        # CUTLASS headers from the carried wheel
  [build]=130      # dcoco for this GPU's arch alone (sm_90a on an H200), on every core: one arch took 144 s
                   # on 2 busy cores, 105 s of it cuda/forward.cu alone, so nvcc --split-compile spreads that file
  [env]=10         # $OUT/env.json: the GPU, torch, dcoco.build_info(); the fused path must load
  [tests]=60       # tests/ops/test_cuda.py + test_select.py on CUDA, each test under both backends, vs the reference
  [hook]=40        # tests/gpu/gpu_hook.py: the plugin's hook eager and replayed in a CUDA graph, both backends,
                   # R 1/8/32, the paper's corrector and an anchor-aware one, checked against the CPU core,
                   # timed against plain DFlash (argmax only)
  [sanitizer]=40   # tests/gpu/gpu_sanitize.py: memcheck, racecheck, synccheck at once, on dcoco's kernels only
  [bench]=15       # bench/gpu_bench.py --quick: kernel timings of both backends, R 1..256, and training
  [report]=5       # bench/gpu_report.py: $OUT/<gpu>-<date>.json; its "passed" may validate the arch
)
# On a machine with an NVIDIA GPU, nvcc and python3 with torch, from a checkout where .whl/ holds
# nvidia_cutlass-4.2.0.0-py3-none-any.whl (pip download --no-deps nvidia-cutlass==4.2.0.0 -d .whl; the GPU machine
# needs no network then):  OUT=/tmp/gpu_check bash bench/gpu_check.sh
# $OUT gets 8 files: summary.txt, build.log, env.json, junit.xml, hook.json,
# sanitizer.json, gpu_bench.json and the report. Commit the report as bench/results/gpu/<gpu>-<date>.json: its
# "passed" (fused tests, the hook on the fused backend, and all three sanitizers clean on dcoco's kernels) is what
# may put its arch into backend.VALIDATED_CUDA_ARCHS.
#
# Rehearsal on a CPU machine, so that a typo cannot waste a GPU run: `bash bench/gpu_check.sh --rehearse` runs
# every step with .venv's python, a CPU-only build, the device "cpu" (the hook at small sizes, its CUDA-graph parts
# skipped), compute-sanitizer replaced by a shim that runs the command bare, and gpu_bench.py --rehearse (every
# call at small sizes, timed eagerly), each under the rehearsal's own timeouts (RT: 2 cores); it ends with the
# report, whose "passed" is false (no GPU ran).
# CI runs it (scripts/rehearse_gpu_check.sh).
declare -A RT=([wheel]=60 [build]=900 [env]=60 [tests]=300 [hook]=300 [sanitizer]=300 [bench]=120 [report]=60)
set -uo pipefail

if [ "${1:-}" = "--plan" ]; then
  sum=0 steps=""
  for s in "${STEPS[@]}"; do sum=$((sum + T[$s])); steps+="${steps:+, }\"$s\": ${T[$s]}"; done
  echo "{\"limit_s\": $LIMIT, \"start_s\": $START, \"steps_s\": {$steps}, \"total_s\": $((START + sum))}"
  exit 0
fi
rehearse=0
[ "${1:-}" = "--rehearse" ] && rehearse=1
OUT=${OUT:-/tmp/gpu_check}
W=/tmp/gpu_work  # logs and build files that do not come back
rm -rf "$W"
mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
tmo() { if [ $rehearse = 1 ]; then echo "${RT[$1]}"; else echo "${T[$1]}"; fi; }
ended() { log "step $1: exit $2 in $((SECONDS - $3)) s (timeout $(tmo "$1") s)"; }  # gpu_report.py parses this
report() {
  local s=$SECONDS
  timeout "$(tmo report)" python3 bench/gpu_report.py "$OUT" | tee -a "$OUT/summary.txt"
  ended report "${PIPESTATUS[0]}" $s
}
log "plan: $(bash "$0" --plan)"

cuda=ON hook_args=() san_args=() bench_args=()
if [ $rehearse = 1 ]; then  # a 2-core CPU machine: CPU-only build, small hook sizes
  cuda=OFF hook_args=(--device cpu --R 1 2 --V 1000 --d 64 --reps 5 --self-check) san_args=(--device cpu)
  bench_args=(--rehearse)
  mkdir -p "$W/bin"
  printf '#!/usr/bin/env bash\nexec "%s/.venv/bin/python3" "$@"\n' "$PWD" >"$W/bin/python3"  # a link would lose the venv
  printf '#!/usr/bin/env bash\n# compute-sanitizer --opt value ... cmd...: the rehearsal runs cmd bare (every option takes a value)\nwhile [ "${1#--}" != "$1" ]; do shift 2; done; exec "$@"\n' \
    >"$W/bin/compute-sanitizer"
  chmod +x "$W/bin/compute-sanitizer" "$W/bin/python3"
  export PATH="$W/bin:$PATH"
  log "rehearsal: CPU only, GPU steps stubbed"
fi

# wheel
s=$SECONDS
timeout "$(tmo wheel)" python3 -m pip install -q --no-index --no-deps --target "$W/site" .whl/nvidia_cutlass-*.whl
rc=$?; ended wheel $rc $s
[ $rc = 0 ] || { report; exit 1; }
export PYTHONPATH="$W/site"

# build: the arch from nvidia-smi (importing torch would cost seconds here); split-compile spreads the one big
# translation unit over the cores, and the build tree stays out of the repo's build/
arch=90a  # the rehearsal's stand-in
if [ $rehearse = 0 ]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -n "$cap" ] || cap=$(python3 -c "import torch; print('%d%d' % torch.cuda.get_device_capability())")
  arch=$cap; [ $((cap / 10)) -ge 9 ] && arch=${cap}a  # the arch-specific instructions (wgmma, tcgen05)
fi
log "building for $arch on $(nproc) cores"
s=$SECONDS
CUDAFLAGS="--split-compile=0 --threads 0" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) DCOCO_CUDA=$cuda DCOCO_CUDA_ARCHS="$arch" \
  timeout "$(tmo build)" python3 -m pip install -q --no-build-isolation --no-deps --config-settings=build-dir="$W/build" \
  --target "$W/dcoco" . >"$OUT/build.log" 2>&1
rc=$?; ended build $rc $s
[ $rc = 0 ] || { tail -30 "$OUT/build.log"; report; exit 1; }
export PYTHONPATH="$W/dcoco:$W/site"

# env
s=$SECONDS
timeout "$(tmo env)" python3 - "$OUT/env.json" <<'PY'
import json, os, sys, torch, dcoco
cuda = torch.cuda.is_available()
cap = torch.cuda.get_device_capability() if cuda else (0, 0)
env = {"gpu": torch.cuda.get_device_name() if cuda else "cpu rehearsal", "arch": f"sm_{cap[0]}{cap[1]}",
       "cuda": cuda, "fused_cuda": dcoco.cuda_available(), "torch": torch.__version__, "cores": os.cpu_count(),
       "dcoco": dcoco.build_info()}
open(sys.argv[1], "w").write(json.dumps(env, indent=1))
print(env["gpu"], env["arch"], "fused CUDA path:", env["fused_cuda"], "torch", env["torch"])
PY
rc=$?; ended env $rc $s

# tests: SIGINT 5 s before the step's end, so pytest still writes the junit of what ran
s=$SECONDS
timeout -s INT -k 5 $(($(tmo tests) - 5)) python3 -m pytest -q -p no:cacheprovider --junitxml="$OUT/junit.xml" \
  tests/ops/test_cuda.py tests/ops/test_select.py >"$W/tests.log" 2>&1
rc=$?; tail -15 "$W/tests.log"; ended tests $rc $s
log "tests: $(tail -1 "$W/tests.log")"

# hook
s=$SECONDS
timeout "$(tmo hook)" python3 tests/gpu/gpu_hook.py --out "$OUT/hook.json" "${hook_args[@]}" >"$W/hook.log" 2>&1
rc=$?; tail -18 "$W/hook.log"; ended hook $rc $s

# sanitizer: its own deadline a little inside the step's, so the JSON is written
s=$SECONDS
timeout "$(tmo sanitizer)" python3 tests/gpu/gpu_sanitize.py --out "$OUT/sanitizer.json" \
  --timeout $(($(tmo sanitizer) - 5)) --logs "$W" "${san_args[@]}" 2>&1 | tee "$W/sanitizer.log"
rc=${PIPESTATUS[0]}; ended sanitizer $rc $s

# bench
s=$SECONDS
timeout "$(tmo bench)" python3 bench/gpu_bench.py --quick --out "$OUT" "${bench_args[@]}" >"$W/bench.log" 2>&1
rc=$?; tail -16 "$W/bench.log"
ended bench $rc $s

report
