"""The one JSON of a device check (bench/gpu_check.sh step 7): python bench/gpu_report.py WORK OUT

Reads WORK (junit.xml, sanitizer_*.{rc,log}, train_*.json, gpu_bench.json, vllm.json) and writes
OUT/<gpu>-<date>.json: per backend the test counts and failures, the sanitizer results, the training smokes, the
timings, the vLLM step, and
"passed": every fused check green (tests, the three sanitizers, the fused training smoke). Only an arch with a
committed passing JSON may enter backend.VALIDATED_CUDA_ARCHS (tests/test_backend.py checks it).
"""

import json
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path


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


def main(work: str, out: str) -> None:
    import torch

    import dcoco

    work, out = Path(work), Path(out)
    gpu_ran = torch.cuda.is_available()  # false in gpu_check.sh's CPU rehearsal: a report that cannot pass
    major, minor = torch.cuda.get_device_capability() if gpu_ran else (0, 0)
    gpu = torch.cuda.get_device_name() if gpu_ran else "cpu rehearsal"
    sanitizer = {}
    for tool in ("memcheck", "racecheck", "synccheck"):
        rc = (work / f"sanitizer_{tool}.rc").read_text().strip() if (work / f"sanitizer_{tool}.rc").exists() else ""
        text = (work / f"sanitizer_{tool}.log").read_text() if (work / f"sanitizer_{tool}.log").exists() else ""
        summary = [line for line in text.splitlines() if "ERROR SUMMARY" in line or "small case ok" in line]
        sanitizer[tool] = {"returncode": int(rc) if rc.lstrip("-").isdigit() else None, "summary": summary,
                           "tail": text.splitlines()[-5:]}
    train = {b: read_json(work / f"train_{b}.json") for b in ("fused", "native")}
    t = tests(work / "junit.xml")

    def green(b: str) -> bool:
        run = train[b] or {}
        return (t[b]["failed"] == 0 and t[b]["passed"] > 0 and run.get("returncode") == 0
                and run.get("steps") == run.get("requested", 20))

    report = {
        "gpu": gpu, "arch": f"sm_{major}{minor}", "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
        "dcoco": dcoco.build_info(), "tests": t, "sanitizer": sanitizer, "train_smoke": train,
        "bench": read_json(work / "gpu_bench.json"),
        "vllm": read_json(work / "vllm.json"),  # None: vLLM not on the image, or the step failed
        "passed": gpu_ran and green("fused") and all(s["returncode"] == 0 for s in sanitizer.values()),
        "native_passed": green("native"),
    }
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    path = out / f"{slug}-{report['date']}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"{path.name}: fused passed={report['passed']} native passed={report['native_passed']} "
          f"tests {json.dumps({b: {k: v for k, v in r.items() if k != 'failures'} for b, r in t.items()})}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
