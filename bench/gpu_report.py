"""The one JSON of a device check (bench/gpu_check.sh's last step): python bench/gpu_report.py OUT [DEST]

Reads what the steps left in OUT (summary.txt, env.json, junit.xml, hook.json, sanitizer.json, gpu_bench.json; any
may be missing when a step failed or the call was cut off) and writes OUT/<gpu>-<date>.json: the plan and each
step's exit and seconds, per backend the test counts and failures, the hook's cases, the sanitizer verdicts (error
records outside dcoco's kernels are listed there, and never fail dcoco), the timings, and
"passed": a GPU ran the fused kernel, and on the fused backend every test passed (the run complete), every hook case
was ok, and each of the three sanitizers ran its case to the end with no error in dcoco's kernels;
"native_passed": the tests and the hook on the native backend. Only an arch with a committed passing JSON may enter
backend.VALIDATED_CUDA_ARCHS (tests/ops/test_backend.py checks it). Needs no torch, so it also runs on a folder fetched
back from the device after a call that was cut off before this step (DEST, default OUT: where the JSON goes, as
that folder is read-only).
"""

import json
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

FILES = ("summary.txt", "env.json", "junit.xml", "hook.json", "sanitizer.json", "gpu_bench.json")
TOOLS = ("memcheck", "racecheck", "synccheck")


def tests(junit: Path) -> dict:
    out = {b: {"passed": 0, "failed": 0, "skipped": 0, "failures": []} for b in ("fused", "native")}
    if not junit.exists():
        return out
    for case in ET.parse(junit).iter("testcase"):
        name = case.get("name", "")
        found = re.search(r"\[.*\b(fused|native)\b.*\]", name)
        row = out[found.group(1) if found else "fused"]
        if case.find("skipped") is not None:
            row["skipped"] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            row["failed"] += 1
            row["failures"].append(f"{case.get('classname')}::{name}")
        else:
            row["passed"] += 1
    return out


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps(summary: Path) -> tuple[dict | None, dict]:
    """The plan and each step's {exit, seconds, timeout}, from gpu_check.sh's summary lines."""
    text = summary.read_text() if summary.exists() else ""
    plan = re.search(r"^== plan: (\{.*\})$", text, re.M)
    rows = {m[1]: {"exit": int(m[2]), "seconds": int(m[3]), "timeout": int(m[4])}
            for m in re.finditer(r"^== step (\w+): exit (\d+) in (\d+) s \(timeout (\d+) s\)$", text, re.M)}
    return (json.loads(plan[1]) if plan else None), rows


def main(out: str, dest: str | None = None) -> None:
    out = Path(out)
    env = read_json(out / "env.json") or {}
    plan, ran = steps(out / "summary.txt")
    t = tests(out / "junit.xml")
    hook = read_json(out / "hook.json") or {}
    sanitizer = read_json(out / "sanitizer.json") or {}
    complete = ran.get("tests", {}).get("exit") in (0, 1)  # 1: some failed; anything else: cut off or broken

    def green(b: str) -> bool:
        return complete and t[b]["failed"] == 0 and t[b]["passed"] > 0 and bool((hook.get("passed") or {}).get(b))

    clean = all((sanitizer.get(tool) or {}).get("verdict") == "clean" for tool in TOOLS)
    gpu = env.get("gpu", "unknown")
    report = {
        "gpu": gpu, "arch": env.get("arch"), "date": time.strftime("%Y-%m-%d"), "torch": env.get("torch"),
        "dcoco": env.get("dcoco"), "plan": plan, "steps": ran, "missing": [f for f in FILES if not (out / f).exists()],
        "tests": t, "hook": hook, "sanitizer": sanitizer, "bench": read_json(out / "gpu_bench.json"),
        "passed": bool(env.get("cuda") and env.get("fused_cuda")) and green("fused") and clean,
        "native_passed": bool(env.get("cuda")) and green("native"),
    }
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    path = Path(dest or out) / f"{slug}-{report['date']}.json"
    path.write_text(json.dumps(report, indent=1))
    verdicts = {tool: (sanitizer.get(tool) or {}).get("verdict") for tool in TOOLS}
    print(f"{path.name}: fused passed={report['passed']} native passed={report['native_passed']} "
          f"tests {json.dumps({b: {k: v for k, v in r.items() if k != 'failures'} for b, r in t.items()})} "
          f"hook {json.dumps(hook.get('passed'))} sanitizer {json.dumps(verdicts)} missing {report['missing']}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
