#!/usr/bin/env bash
# bench/gpu_check.sh rehearsed on this CPU machine (GPU steps stubbed), so a run on a GPU never meets a typo: its
# plan must fit its time limit (START, the GPU machine's start and transfers, plus every step's timeout <= LIMIT,
# both set in bench/gpu_check.sh), every step must run and the report must be written. Needs .venv
# (scripts/setup.sh). Downloads the CUTLASS wheel into .whl/ when it is not there: the check installs CUTLASS's
# headers from that wheel, so a copy of this checkout runs it on a GPU machine without network access.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1 ||
  .venv/bin/python -m pip download -q --no-deps nvidia-cutlass==4.2.0.0 -d .whl
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
plan=$(bash bench/gpu_check.sh --plan)
OUT="$out" bash bench/gpu_check.sh --rehearse
report=$(ls "$out"/*-*.json)
.venv/bin/python - "$report" "$plan" <<'PY'
import json, sys
r, plan = json.load(open(sys.argv[1])), json.loads(sys.argv[2])
total = plan["start_s"] + sum(plan["steps_s"].values())
assert total == plan["total_s"] <= plan["limit_s"], f"device plan {plan}: {total} s > {plan['limit_s']} s"
assert r["plan"] == plan, (r["plan"], plan)
assert set(r["steps"]) == set(plan["steps_s"]) - {"report"}, f"steps that did not run: {r['steps']}"
assert all(s["exit"] == 0 for s in r["steps"].values()), r["steps"]
assert r["missing"] == [], f"missing from OUT: {r['missing']}"
assert [x["R"] for x in r["bench"]["rows"]] == [1, 4] and [x["R"] for x in r["bench"]["train"]] == [1, 8], r["bench"]
assert r["passed"] is False and r["native_passed"] is False, "a rehearsal must never pass"
assert r["tests"]["fused"]["failed"] == 0 == r["tests"]["native"]["failed"], r["tests"]
cases = r["hook"]["cases"]
assert len(cases) == 2 * 2 * 3 and all(c["ok"] and c["error"] is None for c in cases), cases  # backend, R, case
assert sum(c["anchor"] for c in cases) == 4, "gpu_hook.py ran no anchor-aware case"
assert r["hook"]["passed"] == {"fused": True, "native": True}, r["hook"]["passed"]
assert r["hook"]["self_check"] == {"1": True, "2": True}, "gpu_hook.py's walk check missed a tampered walk"
assert all(s["verdict"] == "clean" for s in r["sanitizer"].values()) and len(r["sanitizer"]) == 3, r["sanitizer"]
print(f"gpu_check rehearsal: device plan {plan['total_s']} s of {plan['limit_s']} (start {plan['start_s']} + "
      f"steps {plan['steps_s']}); every step ran ({ {k: v['seconds'] for k, v in r['steps'].items()} } s here), "
      f"{sys.argv[1].rsplit('/', 1)[1]} written")
PY
echo "gpu_check rehearsal: $((SECONDS - start)) s"
