"""A short `dcoco train --mode joint` on a tiny random target (dcoco.testing.tiny), on the given device, under the
backend DCOCO_BACKEND selects, with the target's features captured online or from a cache. A standalone check
on a GPU (bench/gpu_check.sh leaves it out: the device call's time goes to the fused kernel's checks, and the
tests cover the backward); also runs on a CPU. Prints one JSON line: {backend, device, features,
grad_checkpoint, requested, returncode, steps, first and last losses, seconds}.

  DCOCO_BACKEND=fused python tests/gpu/gpu_train_smoke.py --device cuda --steps 50 --features online --grad-checkpoint
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import dcoco
from dcoco import cli
from dcoco.testing import tiny


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--features", choices=("auto", "cache", "online"), default="auto")
    ap.add_argument("--grad-checkpoint", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tiny.save_target(tmp / "target")
        t = time.perf_counter()
        rc = cli.main(tiny.train_args(tmp / "target", tmp / "cache", tmp / "out", "--mode", "joint", "--steps",
                                      str(args.steps), "--device", args.device, "--seqs-per-step", "2",
                                      "--features", args.features,
                                      *(["--grad-checkpoint"] if args.grad_checkpoint else [])))
        log = tmp / "out" / "log.jsonl"
        rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        print(json.dumps({"backend": dcoco.ops.backend.resolve(args.device)[0], "device": args.device,
                          "features": args.features, "grad_checkpoint": args.grad_checkpoint,
                          "requested": args.steps, "returncode": rc,
                          "steps": len(rows), "first": rows[0] if rows else None, "last": rows[-1] if rows else None,
                          "seconds": round(time.perf_counter() - t, 1)}))


if __name__ == "__main__":
    main()
