#!/usr/bin/env bash
# bench/gpu_check.sh rehearsed on this CPU machine (GPU steps stubbed): every step must run and the report must be
# written, so a lent device never meets a typo. Needs .venv (scripts/setup.sh); fetches the CUTLASS wheel the
# device call carries into .whl/ when it is not there (as the device README says to).
set -euo pipefail
cd "$(dirname "$0")/.."
ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1 ||
  .venv/bin/python -m pip download -q --no-deps nvidia-cutlass==4.2.0.0 -d .whl
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
OUT="$out" bash bench/gpu_check.sh --rehearse
report=$(ls "$out"/*.json)
.venv/bin/python - "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["passed"] is False, "a rehearsal must never pass"
assert r["tests"]["fused"]["failed"] == 0 == r["tests"]["native"]["failed"], r["tests"]
assert all(s["returncode"] == 0 for s in r["sanitizer"].values()), r["sanitizer"]
assert all(t and t["returncode"] == 0 and t["steps"] == t["requested"] for t in r["train_smoke"].values()), r["train_smoke"]
print("gpu_check rehearsal: every step ran,", sys.argv[1].rsplit("/", 1)[1], "written")
PY
