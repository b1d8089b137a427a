"""What `dcoco bench` runs: the paper's serving benchmark against any OpenAI-compatible server (vLLM, SGLang, ...).

Every conversation of every suite is sent through /v1/chat/completions, once per setting (greedy or a sampling
seed) and concurrency; per request the figure is generated tokens / wall time including prefill. Per suite: the
median of those at concurrency 1, aggregate output tokens/s (tokens / wall time of the suite's batch) above it,
and tau = 1 + accepted / drafts from the server's spec-decode counters (/metrics scraped around each batch).
Records are appended to requests.jsonl and batches.jsonl as they finish; rerunning with the same --out resumes.
Tables and plots: report."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..chat import chat
from ..errors import ExternalError
from ..files import write_text_atomic
from ..jsonl import append_record, read_records, write_records
from ..suites import ALL, SUITES, load, order, read, subset
from . import report

# suites not shipped in data/suites: hub dataset, config, split
HUB = {"alpaca": ("tatsu-lab/alpaca", None, "train"), "speed-bench": ("nvidia/SPEED-Bench", "qualitative", "test")}
COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
SAME = ("model", "max_tokens", "temperature", "thinking")  # what a resumed run must share with the first
WARMUP = "Say hello."


def parse_seeds(text: str) -> list[int | None]:
    """--seeds: 'greedy' (None) and integer sampling seeds, comma-separated."""
    out = []
    for s in text.split(","):
        s = s.strip()
        if s != "greedy" and not s.lstrip("-").isdigit():
            raise ValueError(f"--seeds: expected 'greedy' and/or integer seeds, comma-separated, got {text!r}")
        out.append(None if s == "greedy" else int(s))
    if len(set(out)) != len(out):
        raise ValueError(f"--seeds: {text!r} repeats a setting")
    return out


def parse_concurrency(text: str) -> list[int]:
    """--concurrency: integers >= 1, comma-separated."""
    parts = [s.strip() for s in text.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"--concurrency: expected distinct integers >= 1, comma-separated, got {text!r}")
    return [int(p) for p in parts]


def hub(names: Sequence[str], dest: Path) -> None:
    """Fetch the named suites (keys of HUB) through `datasets` into dest as {"turns": [...]} JSONL."""
    offline = (f"offline, save them as JSONL files named {', '.join(n + '.jsonl' for n in names)} (one "
               f"{{\"turns\": [...]}} line per prompt; SPEED-Bench rows may carry its \"category\") and pass their "
               f"folder with --suites")
    try:
        import datasets
    except ImportError:
        raise ExternalError(
            f"--hub needs the `datasets` package (pip install datasets) and a network; {offline}") from None
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        repo, config, split = HUB[name]
        try:
            ds = datasets.load_dataset(repo, config, split=split)
        except Exception as e:  # noqa: BLE001 (datasets raises many kinds: network, auth, format)
            raise ExternalError(
                f"--hub could not fetch {name} ({repo}): {type(e).__name__}: {e}; {offline}") from None
        if name == "alpaca":  # instruction, optional input
            rows = [{"turns": [r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else "")]} for r in ds]
        else:
            rows = [{"turns": list(r["turns"]), "category": r["category"]} for r in ds]
        write_records(dest / f"{name}.jsonl", rows)


def counters(text: str) -> dict | None:
    """{drafts, draft_tokens, accepted, per_pos: {position: accepted}} summed over label sets (engines, models)
    from Prometheus text; None without spec-decode counters (a server without speculation)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {"per_pos": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.endswith("_total"):
                continue
            name = s.name.removesuffix("_total")
            if name in COUNTERS:
                out[COUNTERS[name]] = out.get(COUNTERS[name], 0.0) + s.value
            elif name == PER_POS:
                pos = s.labels.get("position", "0")
                out["per_pos"][pos] = out["per_pos"].get(pos, 0.0) + s.value
    return out if "drafts" in out else None


def delta(before: dict | None, after: dict | None) -> dict | None:
    """after - before; None when either is missing or the counters went back (a restarted server)."""
    if before is None or after is None or after["drafts"] < before["drafts"]:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS.values()}
    d["per_pos"] = {p: v - before["per_pos"].get(p, 0.0) for p, v in after["per_pos"].items()}
    return d


def key(suite: str, row: int, seed: int | None, conc: int) -> str:
    return f"{suite}/{row}/{'greedy' if seed is None else seed}/c{conc}"


async def scrape(client, base: str) -> dict | None:
    """The server's spec-decode counters, None when it has none or /metrics does not answer."""
    import httpx

    try:
        r = await client.get(f"{base}/metrics", timeout=min(30.0, client.timeout.read))
    except httpx.HTTPError:
        return None
    return counters(r.text) if r.status_code == 200 else None


async def converse(client, base: str, body: dict, turns: Sequence[str]) -> dict:
    """One conversation: the user turns in order, each model answer kept in the context of the next. A record
    {status: ok | error, turns: [{tokens, latency, finish}], tokens, latency, tps} or, on the first failure,
    {status: error, error, http_status (when the server answered), turns done before it}."""
    messages: list[dict] = []
    done: list[dict] = []
    for text in turns:
        messages.append({"role": "user", "content": text})
        r = await chat(client, base, body, messages)
        if r["status"] != "ok":
            return {**r, "turns": done}
        messages.append({"role": "assistant", "content": r["content"]})
        done.append({k: r[k] for k in ("tokens", "latency", "finish")})
    tokens, latency = sum(t["tokens"] for t in done), sum(t["latency"] for t in done)
    return {"status": "ok", "turns": done, "tokens": tokens, "latency": latency, "tps": tokens / latency}


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.pstdev(xs) if len(xs) > 1 else None)


def summarize(config: dict, records: Sequence[dict], batches: Sequence[dict]) -> dict:
    """{spec, cells, rows} from the run's records. A cell per (suite, seed, concurrency): n_ok, n_failed,
    tps_median (per-request tokens / latency), tps_aggregate (batch tokens / batch wall time, summed over resumed
    attempts), tps (the median at concurrency 1, else the aggregate), tau, accept_rate per drafted position. A row
    per (suite, mode greedy | sampling, concurrency): tps and tau, mean and population std over the seeds."""
    last: dict[str, dict] = {}
    for r in records:  # an ok record is never redone, so the last one of a key says how it ended
        last[r["key"]] = r
    cells = []
    for c in config["concurrency"]:
        for seed in config["seeds"]:
            for suite, rows in config["suites"].items():
                recs = [last.get(key(suite, i, seed, c)) for i in rows]
                ok = [r for r in recs if r and r["status"] == "ok"]
                bs = [b for b in batches if (b["suite"], b["seed"], b["concurrency"]) == (suite, seed, c)]
                wall = sum(b["wall"] for b in bs)
                ds = [b["counters"] for b in bs if b["counters"] is not None]
                drafts = sum(d["drafts"] for d in ds)
                med = statistics.median(r["tps"] for r in ok) if ok else None
                agg = sum(b["tokens"] for b in bs) / wall if wall > 0 and ok else None
                pos: dict[str, float] = {}
                for d in ds:
                    for p, v in d["per_pos"].items():
                        pos[p] = pos.get(p, 0.0) + v
                cells.append({"suite": suite, "seed": seed, "concurrency": c, "n_ok": len(ok),
                              "n_failed": len(rows) - len(ok), "tokens": sum(r["tokens"] for r in ok),
                              "tps_median": med, "tps_aggregate": agg, "tps": med if c == 1 else agg,
                              "tau": 1 + sum(d["accepted"] for d in ds) / drafts if drafts else None,
                              "accept_rate": [pos[p] / drafts for p in sorted(pos, key=int)] if drafts else None})
    rows = []
    for c in config["concurrency"]:
        for suite in config["suites"]:
            for mode in ("greedy", "sampling"):
                cs = [x for x in cells if x["suite"] == suite and x["concurrency"] == c
                      and (x["seed"] is None) == (mode == "greedy")]
                if not cs:
                    continue
                tps, tps_std = _mean_std([x["tps"] for x in cs if x["tps"] is not None])
                tau, tau_std = _mean_std([x["tau"] for x in cs if x["tau"] is not None])
                rows.append({"suite": suite, "mode": mode, "concurrency": c, "tps": tps, "tps_std": tps_std,
                             "tau": tau, "tau_std": tau_std, "seeds": len(cs),
                             "n_failed": sum(x["n_failed"] for x in cs)})
    spec = any(b["counters"] is not None for b in batches)
    return {"spec": spec, "cells": cells, "rows": rows}


async def _check(client, base: str, model: str, body: dict) -> None:
    """Fail at once, clearly, when the server is unreachable, does not serve the model or rejects a plain request
    (WARMUP, 8 tokens, which also pays the server's one-off costs before the timed batches)."""
    import httpx

    try:
        r = await client.get(f"{base}/v1/models", timeout=min(30.0, client.timeout.read))  # the user's --timeout
    except httpx.HTTPError as e:
        raise ExternalError(
            f"cannot reach --endpoint {base} ({type(e).__name__}: {e}); is the server running?") from None
    try:
        served = [m["id"] for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
        served = None  # not every server lists its models
    if served is not None and model not in served:
        raise ExternalError(f"--model {model!r} is not served at {base}; it serves {served}")
    rec = await converse(client, base, {**body, "max_tokens": 8}, [WARMUP])
    if rec["status"] != "ok":
        raise ExternalError(f"the first request to {base} failed: {rec['error']}")


def pending(config: dict, records: Sequence[dict], batches: Sequence[dict], spec: bool) -> list[tuple]:
    """(concurrency, seed, suite, rows) still to send: rows without an ok answer, and, against a server with
    spec-decode counters, ok rows that no batch with counters covered (the server died before the batch's /metrics
    was read, or restarted during it): sent again, so that every cell gets a tau from counters it really measured."""
    ok = {r["key"] for r in records if r["status"] == "ok"}
    counted = {key(b["suite"], i, b["seed"], b["concurrency"]) for b in batches if b["counters"] is not None
               for i in b.get("rows", config["suites"].get(b["suite"], ()))}  # no "rows": a batch of the whole cell
    plan = []
    for c in config["concurrency"]:
        for seed in config["seeds"]:
            for suite, rows in config["suites"].items():
                todo = [i for i in rows if key(suite, i, seed, c) not in ok
                        or (spec and key(suite, i, seed, c) not in counted)]
                if todo:
                    plan.append((c, seed, suite, todo))
    return plan


async def _bench(out: Path, config: dict, texts: dict[str, list[dict]], progress: bool) -> tuple[int, int]:
    """Send every pending conversation, appending records as they finish. Returns (requests sent, failed)."""
    import httpx
    from tqdm.auto import tqdm

    base, timeout = config["endpoint"], config["timeout"]

    records, batches = read_records(out / "requests.jsonl"), read_records(out / "batches.jsonl")  # read once, then kept
    limits = httpx.Limits(max_connections=max(config["concurrency"]))
    failed = 0
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=min(timeout, 30.0)), limits=limits) as client:
        spec = await scrape(client, base) is not None
        plan = pending(config, records, batches, spec)
        n = sum(len(p[3]) for p in plan)
        if not n:
            return 0, 0
        await _check(client, base, config["model"], _body(config, None))
        out.mkdir(parents=True, exist_ok=True)  # only now: a server that cannot be used leaves no run behind
        _save(out, config, records, batches)
        bar = tqdm(total=n, desc="bench", unit="req", disable=not progress)
        for c, seed, suite, rows in plan:
            bar.set_postfix_str(f"{suite} {'greedy' if seed is None else f'seed {seed}'} c={c}")
            gate = asyncio.Semaphore(c)
            body = _body(config, seed)

            async def one(i: int) -> dict:
                async with gate:
                    t = time.time()
                    rec = await converse(client, base, body, texts[suite][i]["turns"])
                rec = {"key": key(suite, i, seed, c), "suite": suite, "row": i, "seed": seed, "concurrency": c,
                       "start": t, **rec}
                append_record(out / "requests.jsonl", rec)
                records.append(rec)
                bar.update()
                return rec

            before = await scrape(client, base)
            t0 = time.perf_counter()
            recs = await asyncio.gather(*(one(i) for i in rows))
            wall = time.perf_counter() - t0
            after = await scrape(client, base)
            bad = sum(r["status"] != "ok" for r in recs)
            failed += bad
            batches.append({"suite": suite, "seed": seed, "concurrency": c, "n": len(rows), "rows": rows, "failed": bad,
                            "wall": wall, "counters": delta(before, after),
                            "tokens": sum(r["tokens"] for r in recs if r["status"] == "ok")})
            append_record(out / "batches.jsonl", batches[-1])
            if failed:
                bar.set_description(f"bench ({failed} failed)")
            _save(out, config, records, batches)
        bar.close()
    return n, failed


def _body(config: dict, seed: int | None) -> dict:
    b = {"model": config["model"], "max_tokens": config["max_tokens"], "stream": False,
         "temperature": 0.0 if seed is None else config["temperature"],
         "chat_template_kwargs": {"enable_thinking": config["thinking"]}}
    return b if seed is None else {**b, "seed": seed}


def _save(out: Path, config: dict, records: Sequence[dict], batches: Sequence[dict]) -> dict:
    res = {"config": config, "summary": summarize(config, records, batches)}
    write_text_atomic(out / "run.json", json.dumps(res, indent=2))  # a kill never leaves half a file
    return res


def suites_to_run(paths: Sequence[str | Path] | None, only: Sequence[str] | None, use_hub: bool,
           out: Path) -> tuple[dict[str, list[dict]], list[str]]:
    """(suites to run, a note naming the paper's suites left out). Alpaca and SPEED-Bench are also looked for in
    out/suites, where --hub saves them; only: these names, ValueError when one is absent."""
    found = load(paths)
    saved = out / "suites"
    wanted = list(only) if only else list(SUITES)
    fetch = [n for n in wanted if n in HUB and n not in found and not (saved / f"{n}.jsonl").is_file()]
    if use_hub and fetch:
        hub(fetch, saved)
    for n in wanted:
        if n not in found and (saved / f"{n}.jsonl").is_file():
            found[n] = read(saved / f"{n}.jsonl")
    found = {n: found[n] for n in order(found)}
    absent = [n for n in wanted if n not in found]
    how = "pass a folder holding them with --suites"
    if set(absent) & set(HUB) and not use_hub:
        how += " (Alpaca, SPEED-Bench: or add --hub, with a network)"
    if only:
        if absent:
            raise ValueError(f"--only: suites not found: {', '.join(absent)} (found: {', '.join(found)}); {how}")
        return {n: found[n] for n in order(only)}, []
    return found, [f"suites not found, left out: {', '.join(absent)}; {how}"] if absent else []


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What `dcoco bench` runs: the server (its base URL, with or without /v1) and the served model name; out, the
    run folder; suites (None: the shipped ones), only these names (None: all found), use_hub to fetch Alpaca and
    SPEED-Bench; rows per suite (None: the paper's subsets, suites.ALL: every row); the sampling settings (seed None:
    greedy); the concurrencies to sweep; the seconds to wait for each answer; thinking on in the chat template."""
    endpoint: str
    model: str
    out: str | Path
    suites: Sequence[str | Path] | None = None
    only: Sequence[str] | None = None
    use_hub: bool = False
    rows: int | None = None
    max_tokens: int = 2048
    seeds: Sequence[int | None] = (None, 42, 43, 44)
    temperature: float = 1.0
    concurrency: Sequence[int] = (1,)
    timeout: float = 600.0
    thinking: bool = False


def _check_settings(cfg: BenchConfig) -> str:
    """The server's base URL; ValueError names a bad setting."""
    if cfg.max_tokens < 1:
        raise ValueError(f"--max-tokens: expected an integer >= 1, got {cfg.max_tokens}")
    if cfg.timeout <= 0:
        raise ValueError(f"--timeout: expected seconds > 0, got {cfg.timeout}")
    if cfg.temperature < 0:
        raise ValueError(f"--temperature: expected >= 0, got {cfg.temperature}")
    if cfg.rows is not None and cfg.rows != ALL and cfg.rows < 1:
        raise ValueError(f"--rows: expected an integer >= 1 or 'all', got {cfg.rows}")
    base = cfg.endpoint.rstrip("/").removesuffix("/v1")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"--endpoint: expected an http(s):// URL, got {cfg.endpoint!r}")
    return base


def run(cfg: BenchConfig, progress: bool = True) -> tuple[dict, int]:
    """Everything `dcoco bench` does; returns (run.json's content, failed requests). ValueError names a bad
    argument; ExternalError when the server cannot be used at all. Resumes the run in cfg.out: requests that ended
    ok are kept, failed ones are sent again."""
    base = _check_settings(cfg)
    out, rows = Path(cfg.out), cfg.rows
    texts, notes = suites_to_run(cfg.suites, cfg.only, cfg.use_hub, out)
    config = {"endpoint": base, "model": cfg.model, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
              "thinking": cfg.thinking, "seeds": list(cfg.seeds), "concurrency": list(cfg.concurrency),
              "rows": "paper" if rows is None else "all" if rows == ALL else rows, "timeout": cfg.timeout,
              "suites": {n: subset(n, r, rows) for n, r in texts.items()}}
    old = json.loads((out / "run.json").read_text())["config"] if (out / "run.json").is_file() else None
    if old:
        diff = ", ".join(f"{k}: {old[k]!r}" for k in SAME if old[k] != config[k])
        if diff:
            raise ValueError(f"--out: {out} holds a run with other settings ({diff}); pick another --out to start a "
                             f"new run")
    for note in notes:
        print(f"dcoco bench: {note}", file=sys.stderr)
    sent, failed = asyncio.run(_bench(out, config, texts, progress))
    res = _save(out, config, read_records(out / "requests.jsonl"), read_records(out / "batches.jsonl"))
    print(report.run_table(res))
    paths = report.write_run(res, out)
    print(f"wrote {', '.join(map(str, [out / 'requests.jsonl', *paths]))}")
    if failed:
        print(f"dcoco bench: {failed} of {sent} requests failed (errors in {out / 'requests.jsonl'}); rerun the "
              f"same command to retry them", file=sys.stderr)
    return res, failed
