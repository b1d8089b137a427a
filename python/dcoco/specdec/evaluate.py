"""What `dcoco eval` runs: speculative decoding against target-only decoding over prompt suites, in the same
run, with tau, the oracle ceilings, coverage, tokens/s and a greedy losslessness check; results.json and plots.

The core (evaluate, write) takes already-tokenized prompts. `dcoco eval` (run) decodes conversations: the rows
`dcoco bench` draws, every turn (load_chats, evaluate_chats). The demo reads first turns (suites.load_suites,
encode)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from .. import plots
from ..suites import ALL, load, subset
from ..target.corpus import chat_ids
from ..target.load import load_target
from .engine import KS, Engine, Result, summarize, target_only

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def encode(tokenizer, suites: Mapping[str, Sequence[str]], thinking: bool = False) -> dict[str, list[list[int]]]:
    """Chat-templated ids (one user turn plus the generation prompt) of every prompt; thinking off by default
    (enable_thinking, for templates that read it, e.g. Qwen3's: DFlash drafters and `dcoco bench` are
    non-thinking)."""
    return {name: [chat_ids(tokenizer, p, thinking) for p in prompts] for name, prompts in suites.items()}


def _row(spec: dict, base: dict) -> dict:
    tps, tps0 = spec["tokens_per_s"], base["tokens_per_s"]
    return {"tau": spec["tau"], "tau_oracle_walk": spec.get("tau_oracle_walk"),
            "tau_oracle_prefix_first": spec.get("tau_oracle_prefix_first"),
            "transition_hit_rate": spec.get("transition_hit_rate"), "tps_spec": tps, "tps_target_only": tps0,
            "speedup": tps / tps0 if tps and tps0 else None, "coverage": spec.get("coverage"),
            "accept_rate": spec.get("accept_rate"), "spec": spec, "target_only": base}


@torch.no_grad()
def decode_all(target: PreTrainedModel, engines: Mapping[str, Engine], suites: Mapping[str, Sequence[list[int]]],
               max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               seed: int = 0, progress: bool = True, warm_up: bool = True
               ) -> tuple[dict[str, dict[str, list[Result]]], list[dict]]:
    """Decode every prompt (token ids) of every suite target-only, then with each engine in turn, so all see the
    same machine state. Returns ({"target-only" or engine name: {suite: [Result]}}, mismatches): greedy
    decodes must reproduce target-only exactly; a mismatch is {method, suite, row, first_diff}."""
    from tqdm.auto import tqdm

    if not suites or not all(suites.values()):
        raise ValueError("suites: expected at least one suite, each with at least one prompt")
    kw: dict[str, Any] = dict(temperature=temperature, top_p=top_p, top_k=top_k)
    greedy = temperature == 0
    eos = list(next(iter(engines.values())).eos)
    first = next(iter(suites.values()))[0]
    if warm_up:  # the first call of each path pays one-off costs
        target_only(target, first, 2, **kw)
        for e in engines.values():
            e.generate(first, 2, **kw)
    bar = tqdm(total=sum(map(len, suites.values())) * (1 + len(engines)), desc="eval", unit="decode",
               disable=not progress)
    out: dict[str, dict[str, list[Result]]] = {m: {} for m in ("target-only", *engines)}
    mismatches = []
    for name, prompts in suites.items():
        for m in out:
            out[m][name] = []
        for i, ids in enumerate(prompts):
            gen = (lambda: None) if greedy else (lambda: torch.Generator().manual_seed(seed + i))  # noqa: B023 (called in this iteration)
            base = target_only(target, ids, max_new_tokens, generator=gen(), eos_token_id=eos, **kw)
            out["target-only"][name].append(base)
            bar.update()
            ref = base.tokens if greedy else None
            for m, e in engines.items():
                r = e.generate(ids, max_new_tokens, generator=gen(), reference=ref, **kw)
                out[m][name].append(r)
                if ref is not None and r.tokens != ref:  # ref is set when greedy
                    diff = next((j for j, (a, b) in enumerate(zip(r.tokens, ref)) if a != b),
                                min(len(ref), len(r.tokens)))
                    mismatches.append({"method": m, "suite": name, "row": i, "first_diff": diff})
                bar.update()
    bar.close()
    return out, mismatches


def load_chats(paths: Sequence[str | Path] | None = None, rows: int | None = 8) -> dict[str, list[list[str]]]:
    """{suite: the user turns of each chosen row}: `dcoco bench`'s rows (suites.subset: drawn with its seed,
    the same rows as `dcoco bench --rows N`; None: the paper's subsets; suites.ALL: every row), every turn."""
    bad = isinstance(rows, bool) or not isinstance(rows, int) or (rows < 1 and rows != ALL)
    if rows is not None and bad:
        raise ValueError(f"rows: expected an integer >= 1, 'all' or None (the paper's subsets), got {rows!r}")
    suites = load(paths, "suites")
    return {name: [rs[i]["turns"] for i in subset(name, rs, rows)] for name, rs in suites.items()}


def evaluate_chats(target: PreTrainedModel, engine: Engine, tokenizer, chats: Mapping[str, Sequence[Sequence[str]]],
                   max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                   seed: int = 0, thinking: bool = False, progress: bool = True) -> dict:
    """evaluate() over conversations, every user turn: turn t of a row is decoded in the context of its earlier
    turns and the target-only answers to them (what a chat server would have answered, so the speculative and
    target-only decodes see the same prompt). Rounds of decode_all, one per turn index; mismatches carry the turn."""
    base: dict[str, list[Result]] = {n: [] for n in chats}
    spec: dict[str, list[Result]] = {n: [] for n in chats}
    history: dict[str, list[list[dict[str, str]]]] = {n: [[] for _ in rows] for n, rows in chats.items()}
    mismatches = []
    for t in range(max((len(r) for rows in chats.values() for r in rows), default=0)):
        todo = {n: [i for i, r in enumerate(rows) if len(r) > t] for n, rows in chats.items()}
        todo = {n: idx for n, idx in todo.items() if idx}
        for n, idx in todo.items():
            for i in idx:
                history[n][i].append({"role": "user", "content": chats[n][i][t]})
        prompts = {n: [chat_ids(tokenizer, history[n][i], thinking) for i in idx] for n, idx in todo.items()}
        res, mm = decode_all(target, {"spec": engine}, prompts, max_new_tokens, temperature, top_p, top_k,
                             seed + 100_003 * t, progress, warm_up=t == 0)
        mismatches += [{"suite": m["suite"], "row": todo[m["suite"]][m["row"]], "turn": t,
                        "first_diff": m["first_diff"]} for m in mm]
        for n, idx in todo.items():
            for j, i in enumerate(idx):
                answer = res["target-only"][n][j].tokens
                history[n][i].append({"role": "assistant",
                                      "content": tokenizer.decode(answer, skip_special_tokens=True)})
            base[n] += res["target-only"][n]
            spec[n] += res["spec"][n]
    return _results(spec, base, mismatches, temperature)


def evaluate(target: PreTrainedModel, engine: Engine, suites: Mapping[str, Sequence[list[int]]],
             max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
             progress: bool = True) -> dict:
    """decode_all with one engine. Returns {"suites": {name: row}, "overall": row, "lossless": bool | None,
    "mismatches": [...]}; a row has tau, tau_oracle_walk, tau_oracle_prefix_first (greedy only),
    transition_hit_rate (greedy, with a corrector), tps_spec, tps_target_only, speedup, coverage {k: per slot},
    accept_rate and both summarize() dicts. Greedy: lossless is False and mismatches lists {suite, row,
    first_diff} when the engine's output differs from target-only; sampling: lossless is None."""
    res, mismatches = decode_all(target, {"spec": engine}, suites, max_new_tokens, temperature, top_p, top_k, seed,
                                 progress)
    return _results(res["spec"], res["target-only"],
                    [{k: v for k, v in m.items() if k != "method"} for m in mismatches], temperature)


def _results(spec: Mapping[str, list[Result]], base: Mapping[str, list[Result]], mismatches: list[dict],
             temperature: float) -> dict:
    from .stats import tau_table

    groups = {**spec, "overall": [r for rs in spec.values() for r in rs]}
    bases = {**base, "overall": [r for rs in base.values() for r in rs]}
    rows = {g: {**_row(summarize(rs), summarize(bases[g])), "prompts": len(rs),
                "tau_ci": tau_table({"spec": rs}, "spec")["spec"]["tau_ci"]} for g, rs in groups.items()}
    overall = rows.pop("overall")
    return {"suites": rows, "overall": overall, "lossless": not mismatches if temperature == 0 else None,
            "mismatches": mismatches}


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def table(res: dict) -> str:
    """The per-suite table (and the overall row) as text."""
    head = (f"{'suite':<16}{'tau':>7}{'95% CI':>16}{'oracle':>8}{'tok/s spec':>12}{'tok/s target':>14}"
            f"{'speedup':>9}")
    lines = [head, "-" * len(head)]
    for name, r in [*res["suites"].items(), ("overall", res["overall"])]:
        ci = "-" if not r.get("tau_ci") else f"[{r['tau_ci'][0]:.2f}, {r['tau_ci'][1]:.2f}]"
        lines.append(f"{name:<16}{_fmt(r['tau']):>7}{ci:>16}{_fmt(r['tau_oracle_prefix_first']):>8}"
                     f"{_fmt(r['tps_spec'], '.1f'):>12}{_fmt(r['tps_target_only'], '.1f'):>14}"
                     f"{_fmt(r['speedup']):>8}x")
    return "\n".join(lines)


SMALL = 30  # a rate from fewer samples is drawn hollow and flagged


def coverage_plot(coverage: Mapping | None, seen: Sequence[int] | None, path: Path, title: str) -> None:
    """coverage {k: per-slot rate} (spec.summarize; k an int, or its string as a JSON file keeps it) as one line
    per k in KS with Wilson 95% intervals; seen: the samples per slot, written under each slot. Slots with fewer
    than SMALL samples are drawn hollow, and the figure says so; slots never reached are left out."""
    from .stats import wilson

    plt = plots.pyplot()
    seen = list(seen or [])
    rates = {int(k): v for k, v in (coverage or {}).items()}
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(seen)), 4.2))
    for k in KS:
        ys = rates.get(k) or []
        pts = [(i + 1, y, seen[i]) for i, y in enumerate(ys) if y is not None and i < len(seen) and seen[i]]
        if not pts:
            continue
        xs, vs, ns = zip(*pts)
        # every n > 0 (pts keeps reached slots only), so wilson returns an interval, not None
        cis = [cast(tuple[float, float], wilson(round(v * n), n)) for v, n in zip(vs, ns)]
        line = ax.errorbar(xs, vs, yerr=[[v - c[0] for v, c in zip(vs, cis)], [c[1] - v for v, c in zip(vs, cis)]],
                           marker="o", capsize=2, label=f"top-{k}")
        few = [(x, v) for x, v, n in zip(xs, vs, ns) if n < SMALL]
        if few:
            ax.scatter(*zip(*few), s=60, facecolors="white", edgecolors=line[0].get_color(), zorder=3)
    ax.set_xticks(range(1, len(seen) + 1), [f"{i + 1}\nn={n}" for i, n in enumerate(seen)], fontsize=7)
    n_few = sum(0 < n < SMALL for n in seen)
    ax.set(xlabel="drafted slot (n: samples)", ylabel="coverage", ylim=(0, 1.02))
    ax.set_title(title + (f"; hollow: fewer than {SMALL} samples" if n_few else ""), fontsize=9)
    ax.legend(fontsize=7)
    plots.save(fig, path)


def write(res: dict, out: str | Path) -> list[Path]:
    """results.json, coverage.png (overall coverage per slot, one line per k in KS) and tau.png (tau and the
    prefix-first oracle tau per suite) under out; returns the paths."""
    plt = plots.pyplot()

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "coverage.png", out / "tau.png"]
    paths[0].write_text(json.dumps(res, indent=2))
    coverage_plot(res["overall"]["coverage"], res["overall"]["spec"].get("coverage_seen"), paths[1],
                  "verifier token in the drafter's top-k\n(decoded rounds with the prefix accepted; Wilson 95% CIs)")
    names = list(res["suites"])
    x = list(range(len(names)))
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(names)), 4))
    nan = float("nan")
    for off, key, label in ((-0.2, "tau", "tau"), (0.2, "tau_oracle_prefix_first", "oracle tau (prefix-first)")):
        ax.bar([i + off for i in x], [res["suites"][n][key] or nan for n in names], width=0.4, label=label)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set(ylabel="tokens per round", title="tau per suite")
    ax.margins(y=0.25)  # room above the bars for the legend
    ax.legend()
    plots.save(fig, paths[2])
    return paths


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """What `dcoco eval` runs: the drafter checkpoint (DFlash or DCOCO) and the target ('smollm2' or a transformers
    path); suites (None: the shipped ones) and rows per suite as load_chats takes them; the decoding settings
    (temperature 0: greedy); the corrector on or off, and its rule, lam and num_candidates (None: the checkpoint's
    dcoco_config, else greedy and 16); the device, and the folder for results.json and the plots."""
    drafter: str
    target: str = "smollm2"
    suites: Sequence[str] | None = None
    rows: int | None = 8
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    corrector: bool = True
    rule: str | None = None
    lam: float = 0.75
    num_candidates: int | None = None
    seed: int = 0
    device: str = "cpu"
    out: str | Path = "dcoco-eval"
    thinking: bool = False


def run(cfg: EvalConfig, progress: bool = True) -> dict:
    """Everything `dcoco eval` does: load the target and the drafter checkpoint, evaluate every turn of cfg.rows
    rows per suite (load_chats), print the table, write under cfg.out. Exits loudly (stderr) on a greedy
    losslessness failure; the caller sets the exit code."""
    from ..modeling import checkpoint
    from ..modeling.dflash import read_config

    chats = load_chats(cfg.suites, cfg.rows)  # before the slow loads: a bad path fails at once
    d, c = checkpoint.load(cfg.drafter)  # and so does a bad drafter, or a bad rule, lam or K
    dc = read_config(cfg.drafter).get("dcoco_config") or {}
    rule = dc.get("selection", "greedy") if cfg.rule is None else cfg.rule
    num_candidates = dc.get("num_candidates", 16) if cfg.num_candidates is None else cfg.num_candidates
    Engine.check_selection(rule, cfg.lam, num_candidates)
    tok, model = load_target(cfg.target)
    model.to(cfg.device)
    dt = next(model.parameters()).dtype  # the drafter runs in the target's dtype
    engine = Engine(model, d.to(cfg.device, dt).eval(),
                    c.to(cfg.device, dt).eval() if cfg.corrector and c is not None else None,
                    rule=rule, lam=cfg.lam, num_candidates=num_candidates)
    res = evaluate_chats(model, engine, tok, chats, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                         top_p=cfg.top_p, top_k=cfg.top_k, seed=cfg.seed, thinking=cfg.thinking, progress=progress)
    rows = cfg.rows
    res["config"] = {"drafter": str(cfg.drafter), "target": cfg.target, "corrector": engine.corrector is not None,
                     "anchor_transition": bool(getattr(engine.corrector, "anchor_transition", False)),
                     "rule": engine.rule, "lam": cfg.lam, "num_candidates": engine.K,
                     "rows": "paper" if rows is None else "all" if rows < 1 else rows,
                     "conversations": {n: len(c) for n, c in chats.items()},
                     "turns": {n: sum(map(len, c)) for n, c in chats.items()},
                     "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p,
                     "top_k": cfg.top_k, "seed": cfg.seed, "device": cfg.device, "thinking": cfg.thinking}
    print(table(res))
    paths = write(res, cfg.out)
    print(f"wrote {', '.join(map(str, paths))}")
    if res["lossless"] is False:
        print(f"LOSSLESS CHECK FAILED: greedy speculative output differs from target-only on "
              f"{len(res['mismatches'])} prompt(s): {res['mismatches']} (a real bug, or float rounding flipping a "
              f"near-tie between the 1-token and the block-verify target passes)", file=sys.stderr)
    return res
