"""compute-sanitizer on dcoco's own CUDA kernels (bench/gpu_check.sh): memcheck, racecheck and synccheck at once (one
process each, each on its own port), each running this file's small fused case with `--kernel-name kns=dcoco`, so
only kernels whose mangled name holds "dcoco" (namespace dcoco::cuda) are instrumented and torch's and cuBLAS's run
unchecked at full speed. Writes --out (JSON), per tool: returncode, seconds, the stages the case finished, its error
records split into dcoco's (a device frame in dcoco::, or a host frame in dcoco's _C module) and the others
(reported, never dcoco's verdict), and "verdict":
  clean         the case ran to its end and no error record is dcoco's (racecheck's warnings, possible but
                benign hazards, are listed and do not count);
  dcoco_errors  an error record is dcoco's;
  incomplete    cut off or failed before its end without a dcoco record: dcoco's kernels were not all checked.

  python tests/gpu/gpu_sanitize.py --out OUT/sanitizer.json --timeout 40 --logs WORK   # the three tools
  python tests/gpu/gpu_sanitize.py --case [--device cpu]                   # the case alone (what each tool runs)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

TOOLS = ("memcheck", "racecheck", "synccheck")
MARKS = ("dcoco::", "_ZN5dcoco", "dcoco/_C.")  # demangled or mangled kernel names; the module's path (--strip-paths no)
DONE = "case done"


def case(device: str) -> None:
    """Every fused kernel on a small case: both walk designs (R <= 6 walks a grid, above a row per step), the
    score grid and its backward, the table, select, and each kernel path this GPU has, bf16 and float32."""
    import torch

    import dcoco

    dcoco.set_backend("fused")
    dev = torch.device(device)
    paths = [""]
    if dev.type == "cuda":
        best = dcoco._C.cuda_path()
        paths += ["simt"] + (["sm80"] if best != "simt" else []) + ([best] if best in ("sm90", "sm100") else [])

    def stage(name, fn):
        t = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        print(f"stage {name} ok ({time.perf_counter() - t:.2f} s)", flush=True)

    g = torch.Generator().manual_seed(0)
    d, V, B, K = 256, 500, 15, 16
    for R in (2, 8):
        m = dcoco.Corrector(d, num_candidates=K)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        m.to(dev)
        h = torch.randn(R, B, d, generator=g).bfloat16().to(dev)
        ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(R * B)]).view(R, B, K).to(dev)
        lg = torch.randn(R, B, K, generator=g).sort(-1, descending=True).values.bfloat16().to(dev)
        e = torch.randn(V, d, generator=g).bfloat16().to(dev)
        for path in paths:
            os.environ["DCOCO_CUDA_PATH"] = path
            for dt in (torch.bfloat16, torch.float32):
                x = (h.to(dt), ids, lg.to(dt), e.to(dt))
                stage(f"R={R} path={path or 'auto'} {dt} score", lambda: m.score(*x))
                stage(f"R={R} path={path or 'auto'} {dt} walk", lambda: m(*x))
        os.environ["DCOCO_CUDA_PATH"] = ""
        hf = h.float().requires_grad_()
        stage(f"R={R} backward", lambda: m.score(hf, ids, lg.float(), e).sum().backward())
        stage(f"R={R} table", lambda: m.prepare_inference(e))
        stage(f"R={R} walk on the table", lambda: m(h, ids, lg, e))
        with torch.no_grad():
            scores = m.score(h, ids, lg, e)
        for rule in ("greedy", "global", "geometric"):
            stage(f"R={R} select {rule}", lambda: dcoco.select(scores, lg[:, 0], rule))
    print(DONE, flush=True)


def records(text: str) -> list[str]:
    """compute-sanitizer's error records: a line '========= X' (X not indented) and its indented lines."""
    out = []
    for line in text.splitlines():
        if not line.startswith("========="):
            continue
        body = line[len("========="):]
        if body.startswith("     ") and out:
            out[-1] += "\n" + body.strip()
        elif body.strip() and not re.match(r" *(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY)", body):
            out.append(body.strip())
    return out


def verdict(tool: str, returncode: int | None, seconds: float, text: str) -> dict:
    recs = records(text)
    ours = [r for r in recs if any(mark in r for mark in MARKS)]
    errors = [r for r in ours if not r.startswith("Warning")]
    done = any(line.strip() == DONE for line in text.splitlines())
    v = "dcoco_errors" if errors else "clean" if done else "incomplete"
    return {"tool": tool, "returncode": returncode, "timed_out": returncode is None, "seconds": round(seconds, 1),
            "verdict": v, "stages": sum(line.startswith("stage ") for line in text.splitlines()), "done": done,
            "dcoco_errors": errors[:10], "dcoco_warnings": [r for r in ours if r.startswith("Warning")][:10],
            "other_records": [r for r in recs if r not in ours][:10],
            "summary": [line for line in text.splitlines() if "SUMMARY" in line], "tail": text.splitlines()[-8:]}


def run_all(out: str, timeout: float, device: str, logs: str) -> None:
    procs = {}
    for i, tool in enumerate(TOOLS):  # own port each, as they run at once
        cmd = ["compute-sanitizer", "--tool", tool, "--kernel-name", "kns=dcoco", "--error-exitcode", "3",
               "--port", str(49152 + 100 * i), "--strip-paths", "no", "--print-limit", "20",
               "--launch-timeout", "30",  # the default 10 s to connect may not cover three at once importing torch
               sys.executable, os.path.abspath(__file__), "--case", "--device", device]
        log = open(os.path.join(logs, f"sanitizer_{tool}.log"), "w+")
        procs[tool] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True),
                       log, time.monotonic())
    ends, deadline = {}, time.monotonic() + timeout
    while len(ends) < len(procs) and time.monotonic() < deadline:  # polled: each tool's own time is kept
        ends.update({tool: time.monotonic() for tool, (p, _, _) in procs.items()
                     if tool not in ends and p.poll() is not None})
        time.sleep(0.2)
    res = {}
    for tool, (p, log, t0) in procs.items():
        if tool in ends:
            rc = p.returncode
        else:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = None
        log.seek(0)
        res[tool] = verdict(tool, rc, ends.get(tool, time.monotonic()) - t0, log.read())
        log.close()
        print(f"{tool}: {res[tool]['verdict']} (exit {rc}, {res[tool]['seconds']} s, {res[tool]['stages']} stages, "
              f"{len(res[tool]['other_records'])} records outside dcoco)", flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", action="store_true", help="run the case (what each sanitizer runs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="sanitizer.json")
    ap.add_argument("--timeout", type=float, default=40.0, help="seconds for all three (they run at once)")
    ap.add_argument("--logs", default="/tmp", help="where each tool's full log is kept")
    args = ap.parse_args()
    if args.case:
        case(args.device)
    else:
        run_all(args.out, args.timeout, args.device, args.logs)


if __name__ == "__main__":
    main()
