"""`dcoco demo`: the paper's experiment at small scale on the embedded SmolLM2-135M-Instruct target, offline,
CPU or GPU.

1. corpus: the target's own greedy responses shipped as token ids (data/smollm2-corpus.npz, made by
   scripts/make_demo_corpus.py); one teacher-forced target pass computes features and labels here.
2. DFlash: a drafter trained alone, `steps` steps of the DFlash loss over a shortlist (LOSS_VOCAB).
3. DCOCO, the paper's recipe: that drafter trained on jointly with a fresh corrector for `joint_steps` more
   steps; L_corr's gradient into the drafter is weighted by JOINT_CORR_GRAD (0: measured best at this size).
   The DFlash baseline gets the same budget: the same drafter trained on alone for `joint_steps` more steps
   (dflash-long), so extra training is not credited to the corrector. Both use the whole LM head.
4. corrector and dflash2: on the frozen dflash-long drafter, one contract (frozen.py): the drafter's outputs are
   cached once over the corpus, then DCOCO's corrector (L_corr) and DFlash2's candidate selector (selector.py,
   the baseline corrector) train on them with the same steps, batch and optimizer.
5. eval: prompts from rows of the paper's suites (shipped in data/suites) that no training prompt came from.
   tau, its ratios over DFlash with paired 95% bootstrap CIs, the oracles and teacher-forced coverage come from
   greedy decoding simulated exactly (simulate.py: one target pass per prompt, every method on sim_rows prompts
   per suite); tokens/s, speedup and the greedy losslessness check from real decoding of a few of them,
   target-only and by every method in turn (same machine state).

Every stage is cached under $DCOCO_CACHE (~/.cache/dcoco): the corpus under corpus/, the trained checkpoints
(serving layout) under demo/ (demo-full/, demo-smoke/ for the other sizes); an interrupted run resumes and a
second run only evaluates."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import random
import shutil
import time
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from . import checkpoint, corpus, frozen, simulate, smollm2
from . import plots as figures  # demo.plots draws the demo's figures
from .corrector import Corrector
from .selector import CandidateSelector
from .dflash import DFlashDrafter
from .recipe import SMOLLM2, SMOLLM2_TAPS, cache_dir, drafter_config, load_target
from .evaluate import coverage_plot, decode_all, default_suites, encode, load_suites
from .spec import Engine, summarize
from .training import TrainConfig, train

EVAL_ROWS_RESERVED = 32  # the demo evaluates rows below this index of each suite; training never sees them
# training rows per suite from ../shared/data/eval (index >= EVAL_ROWS_RESERVED, shuffled with seed 0); aime25
# (30 rows) is evaluation only, livecodebench prompts are mostly longer than the 300-token cap
TRAIN_ROWS = {"gsm8k": 250, "math500": 150, "mbpp": 120, "humaneval": 80, "arena-hard-v2": 120, "mt-bench": 40,
              "livecodebench": 1000}
CORPUS_FILE = "smollm2-corpus.npz"
LAYERS, BLOCK = 3, 8  # 3 layers cost little next to the 49k-row LM head; 99% of rounds commit <= 4 tokens
# the frozen-drafter correctors (DCOCO's and DFlash2's selector): blocks cached per sequence, blocks per step, the
# selector's codebook rank
FROZEN_ANCHORS, FROZEN_BATCH, SELECTOR_RANK = 64, 256, 32
DFLASH2 = "DFlash + DFlash2 selector (frozen drafter)"
# the joint stage's weight of L_corr's gradient into the drafter: at this drafter size the paper's sum (1) makes
# the drafter's own argmax worse (0.973x DFlash), 0 keeps it and gives DCOCO 1.015x (bench/joint_schedule.py)
JOINT_CORR_GRAD = 0.0
# the first DFlash stage's loss: over the corpus's 4,096 most frequent response tokens plus each batch's labels,
# half the CPU time of a step over all 49,152 rows; at one CPU budget that drafter reaches 1.077x the tau of the
# full-vocabulary one (bench/levers.py), and the stage takes twice the steps for the same time. The later stages
# (the DFlash baseline's and DCOCO's joint steps) keep the whole head, so both see the same loss.
LOSS_VOCAB = 4096


@dataclasses.dataclass(frozen=True)
class Size:
    sequences: int | None  # corpus sequences (None: all)
    steps: int             # DFlash drafter steps from scratch
    joint_steps: int       # then, from that drafter: joint DCOCO steps, and as many DFlash-only steps (baseline)
    corrector_steps: int   # the corrector on the frozen baseline drafter
    suites: tuple[str, ...]
    rows: int              # evaluated prompts per suite
    max_new_tokens: int
    rules: tuple[str, ...]  # DCOCO path rules evaluated
    sim_rows: int           # prompts per suite in the simulated evaluation (tau and its CIs; simulate.py)
    sim_tokens: int         # their max new tokens

    def __post_init__(self):
        assert max(self.rows, self.sim_rows) <= EVAL_ROWS_RESERVED, "evaluated rows must stay clear of training"


ALL_SUITES = ("gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench", "mt-bench", "arena-hard-v2")
SIZES = {  # rows / max_new_tokens: real decoding (tokens/s, losslessness); sim_*: the simulated tau with CIs
    "smoke": Size(16, 3, 2, 2, ("gsm8k", "mbpp"), 1, 12, ("greedy",), 3, 16),
    "default": Size(400, 400, 120, 150, ("gsm8k", "math500", "humaneval", "mt-bench"), 2, 48, ("greedy",), 32, 64),
    "full": Size(None, 2600, 800, 1200, ALL_SUITES, 2, 64, ("greedy", "global", "geometric"), 32, 128),
}


def training_prompts(suites_dir) -> list[str]:
    """The demo corpus's prompts: the set shipped with dcoco, then TRAIN_ROWS of each evaluation suite."""
    out = list(corpus.load_prompts())
    for name, n in TRAIN_ROWS.items():
        rows = load_suites([Path(suites_dir) / f"{name}.jsonl"], rows=10 ** 9)[name][EVAL_ROWS_RESERVED:]
        random.Random(0).shuffle(rows)
        out += rows[:n]
    return out


def workdir(size: str) -> Path:
    return cache_dir() / ("demo" if size == "default" else f"demo-{size}")


def build_corpus(model, size: Size, progress: bool, taps: tuple[int, ...] = tuple(SMOLLM2_TAPS)) -> corpus.Corpus:
    """The shipped sequences (the first size.sequences) with this machine's features at the target layers taps
    and labels, cached."""
    seqs = corpus.load_sequences(resources.files("dcoco") / "data" / CORPUS_FILE)[:size.sequences]
    settings = corpus.CorpusSettings(tuple(taps), max_new_tokens=128)
    return corpus.build_corpus(model, [p for p, _ in seqs], cache_dir() / "corpus", settings, progress=progress,
                               responses=[r for _, r in seqs])


def recipe(cfg: TrainConfig, upstream: dict | None) -> dict:
    """What a stage's result depends on: its training settings and the recipe of the stage it starts from."""
    return {"mode": cfg.mode, "steps": cfg.steps, "loss_vocab": cfg.loss_vocab, "corr_grad": cfg.corr_grad,
            "from": upstream}


def _key(want: dict) -> str:
    return hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()[:12]


def finished(out: Path, want: dict) -> dict | None:
    """The done.json of a stage finished with the recipe want; a stage of another recipe is removed (redone)."""
    done = out / "done.json"
    if done.is_file():
        info = json.loads(done.read_text())
        if info.get("recipe") == want:
            return info
        shutil.rmtree(out)
    return None


def _stage(out: Path, cfg: TrainConfig, data: corpus.Corpus, embed, head, drafter, corrector=None,
           progress: bool = True, upstream: dict | None = None) -> tuple[DFlashDrafter, Corrector | None, dict]:
    """Train once: a stage finished with this recipe (done.json) is loaded, an interrupted one resumed."""
    want = recipe(cfg, upstream)
    info = finished(out, want)
    if info is not None:
        d, c = checkpoint.load(out)
        return d, c, info
    t = time.monotonic()
    resume = (out / "train_state.pt").is_file()  # the demo owns its work folder: anything else there is redone
    cfg = dataclasses.replace(cfg, out=str(out), resume=resume, overwrite=not resume)
    res = train(cfg, data, embed, head, drafter, corrector, progress=progress)
    last = res.history[-20:] or [{}]
    info = {"mode": cfg.mode, "steps": res.step, "seconds": time.monotonic() - t, "recipe": want,
            **{f"final_{k}": sum(r[k] for r in last) / len(last) for k in last[0] if k not in ("step", "lr")}}
    (out / "done.json").write_text(json.dumps(info, indent=2) + "\n")
    return res.drafter, res.corrector, info


def train_all(size: Size, work: Path, data: corpus.Corpus, model, tok, device: str, progress: bool) -> dict:
    """{name: (drafter, corrector or selector, info)} for dflash (from scratch), dflash-long (dflash + joint_steps
    DFlash-only steps: the baseline), dcoco-drafter (dflash + joint_steps joint steps with a fresh corrector), and
    on the frozen dflash-long drafter's cached outputs (frozen.py, one contract): corrector (DCOCO, L_corr) and
    dflash2 (DFlash2's selector), corrector_steps each. Training mutates its drafter, hence the copies."""
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()
    dcfg = drafter_config(model, tok, LAYERS, SMOLLM2_TAPS, BLOCK, smollm2.MASK_TOKEN_ID)

    def cfg(mode, steps, loss_vocab=None):
        return TrainConfig(mode=mode, steps=steps, device=device, save_every=100, log_every=max(1, steps // 10),
                           corr_grad=JOINT_CORR_GRAD, loss_vocab=loss_vocab,
                           save_dtype="float32")  # later stages and the evaluation reload these exactly

    first = cfg("drafter", size.steps, LOSS_VOCAB)
    out = {"dflash": _stage(work / "dflash", first, data, embed, head, dcfg, progress=progress)}
    for name, mode in (("dflash-long", "drafter"), ("dcoco-drafter", "joint")):
        out[name] = _stage(work / name, cfg(mode, size.joint_steps), data, embed, head,
                           copy.deepcopy(out["dflash"][0]), progress=progress, upstream=out["dflash"][2]["recipe"])
    base = out["dflash-long"][0]
    cache = None
    for name, make in (("corrector", lambda: Corrector(base.config.hidden_size)),
                       ("dflash2", lambda: CandidateSelector(base.config.hidden_size, base.config.vocab_size,
                                                             SELECTOR_RANK))):
        want = {"frozen": name, "steps": size.corrector_steps, "from": out["dflash-long"][2]["recipe"]}
        info = finished(work / name, want)
        if info is not None:
            out[name] = (base, _load_frozen(work / name), info)
            continue
        if cache is None:
            t = time.monotonic()
            cache = frozen.build(base.to(device).eval(), data, embed.to(device), head.to(device),
                                 anchors=FROZEN_ANCHORS, path=work / f"drafts-{_key(want['from'])}.safetensors",
                                 progress=progress)  # keyed by the drafter's recipe: a retrained one misses
            cache_seconds = time.monotonic() - t
        torch.manual_seed(0)
        m = make()
        info = {"mode": "frozen drafter, cached outputs", **frozen.train(m, cache, embed, size.corrector_steps,
                                                                           FROZEN_BATCH, progress=progress),
                "cached_blocks": len(cache["target"]), "cache_seconds": cache_seconds, "recipe": want,
                "parameters": sum(p.numel() for p in m.parameters())}
        (work / name).mkdir(parents=True, exist_ok=True)
        save_file(m.state_dict(), str(work / name / "model.safetensors"))
        (work / name / "done.json").write_text(json.dumps(info, indent=2) + "\n")
        out[name] = (base, m, info)
    return out


def _load_frozen(path: Path) -> Corrector | CandidateSelector:
    sd = load_file(str(path / "model.safetensors"))
    if "pred.weight" in sd:
        m = CandidateSelector(sd["proj.weight"].shape[1], sd["pred.weight"].shape[0], sd["pred.weight"].shape[1])
    else:
        m = Corrector(sd["cand_proj.weight"].shape[1], width=sd["cand_proj.weight"].shape[0],
                      mlp_hidden=sd["mlp.0.weight"].shape[0])
    m.load_state_dict(sd)
    return m.eval()


def methods(trained: dict, rules: tuple[str, ...]) -> dict[str, tuple]:
    """{method: (drafter, corrector / selector or None, rule)}, DFlash (the baseline with DCOCO's budget) first."""
    d0, _, _ = trained["dflash-long"]
    d1, c1, _ = trained["dcoco-drafter"]
    out = {"DFlash": (d0, None, "greedy")}
    out.update({f"DCOCO {r}": (d1, c1, r) for r in rules})
    out["DCOCO drafter, corrector off"] = (d1, None, "greedy")
    out["DFlash + corrector (frozen drafter)"] = (d0, trained["corrector"][1], "greedy")
    out[DFLASH2] = (d0, trained["dflash2"][1], "greedy")
    return out


def eval_texts(names: tuple[str, ...], rows: int, suites_dir=None) -> dict[str, list[str]]:
    """The first rows of each named suite found in suites_dir (default: the paper's suites shipped in
    data/suites; a folder without them: every suite in it)."""
    root = Path(suites_dir) if suites_dir else default_suites()
    files = [root / f"{n}.jsonl" for n in names]
    return load_suites([f for f in files if f.is_file()] or [root], rows)


def evaluate_all(model, engines: dict[str, Engine], prompts: dict[str, list], max_new_tokens: int,
                 progress: bool) -> dict:
    """Greedy decodes of every prompt: target-only, then each engine in turn (evaluate.decode_all).
    {"methods": {name: {"overall", "suites"}}, "lossless": bool, "mismatches": [...]}; rows are spec.summarize
    dicts."""
    per, mismatches = decode_all(model, engines, prompts, max_new_tokens, progress=progress)
    out = {"methods": {}, "lossless": not mismatches, "mismatches": mismatches}
    for m, suites in per.items():
        out["methods"][m] = {"overall": summarize([r for rs in suites.values() for r in rs]),
                             "suites": {s: summarize(rs) for s, rs in suites.items()}}
    return out


def headline(ev: dict, sim: dict, rules: tuple[str, ...]) -> dict:
    """The issue-5 keys and their CIs. tau, ratios and coverage come from the simulated evaluation (sim, every
    method on the same prompts; ratios over the DFlash baseline with paired 95% bootstrap CIs); tokens/s and the
    losslessness check from real decoding (ev). DCOCO is the jointly trained drafter with its corrector (greedy
    rule); the oracles are the DFlash run's; coverage is teacher-forced at every anchor (coverage_seen: samples)."""
    m, real = sim["methods"], ev["methods"]
    dfl, dco = m["DFlash"]["overall"], m[f"DCOCO {rules[0]}"]["overall"]
    frozen, sel = m["DFlash + corrector (frozen drafter)"]["overall"], m[DFLASH2]["overall"]
    tps = {k: real[name]["overall"]["tokens_per_s"] for k, name in (
        ("target_only", "target-only"), ("dflash", "DFlash"), ("dcoco", f"DCOCO {rules[0]}"),
        ("dcoco_frozen_drafter", "DFlash + corrector (frozen drafter)"), ("dflash2", DFLASH2))}
    oracle = dfl["tau_oracle_prefix_first"]

    def captured(t):
        return (t - dfl["tau"]) / (oracle - dfl["tau"]) if oracle and oracle > dfl["tau"] else None

    return {"tau_target_only": 1.0, "tau_dflash": dfl["tau"], "tau_dflash_ci": dfl["tau_ci"],
            "tau_dcoco": dco["tau"], "tau_dcoco_ci": dco["tau_ci"], "tau_dcoco_frozen_drafter": frozen["tau"],
            "tau_oracle_prefix_first": oracle, "tau_oracle_walk": dfl["tau_oracle_walk"],
            **{f"tps_{k}": v for k, v in tps.items()},
            "tau_ratio_dcoco_over_dflash": dco["ratio"], "tau_ratio_ci": dco["ratio_ci"],
            "tau_ratio_frozen_over_dflash": frozen["ratio"], "tau_ratio_frozen_ci": frozen["ratio_ci"],
            "tau_dflash2": sel["tau"], "tau_dflash2_ci": sel["tau_ci"], "tau_ratio_dflash2_over_dflash": sel["ratio"],
            "tau_ratio_dflash2_ci": sel["ratio_ci"],
            "headroom_captured_dcoco": captured(dco["tau"]), "headroom_captured_frozen": captured(frozen["tau"]),
            "speedup_dcoco_over_dflash": tps["dcoco"] / tps["dflash"], "coverage": dfl["coverage_tf"],
            "coverage_seen": dfl["coverage_tf_seen"], "simulated_prompts": dfl["prompts"],
            "simulated_rounds": dfl["rounds"], "lossless": ev["lossless"]}


def costs(engines: dict[str, Engine], repeats: int = 200) -> dict[str, dict]:
    """Per method with a corrector or selector: parameters, FLOPs per round (one block; corrector.flops) and the
    CPU/GPU time of a round's selection (Engine.select on one block, R=1) next to the plain argmax's."""
    plain = next(e for e in engines.values() if e.corrector is None)
    c = plain.drafter.config
    h = torch.randn(1, c.block_size - 1, c.hidden_size, generator=torch.Generator().manual_seed(0)).to(plain.embed)
    anchor = torch.zeros(1, dtype=torch.long, device=h.device)

    def seconds(e: Engine) -> float:
        e.select(h, anchor)  # warm-up
        t = time.perf_counter()
        for _ in range(repeats):
            e.select(h, anchor)
        return (time.perf_counter() - t) / repeats

    base = seconds(plain)
    out = {}
    for name, e in engines.items():
        if e.corrector is not None:
            out[name] = {"parameters": sum(p.numel() for p in e.corrector.parameters()),
                         "flops_per_round": e.corrector.flops(c.block_size - 1, e.K),
                         "select_ms_per_round": 1e3 * seconds(e), "argmax_ms_per_round": 1e3 * base}
    return out


def _ci(ci) -> str:
    return "" if not ci else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def table(res: dict) -> str:
    """Per method: simulated tau [95% CI], tau / DFlash [paired 95% CI], tau per suite; tokens/s and speedup over
    target-only from real decoding."""
    sim, real = res["sim"]["methods"], res["eval"]["methods"]
    suites = list(sim["DFlash"]["suites"])
    tps0 = real["target-only"]["overall"]["tokens_per_s"]
    w = max(map(len, real)) + 2
    head = (f"{'method':<{w}}{'tau [95% CI]':>22}{'vs DFlash [95% CI]':>24}{'tok/s':>8}{'speedup':>9}" +
            "".join(f"{s[:9]:>10}" for s in suites))
    lines = [head, "-" * len(head)]
    for name in real:
        tps = real[name]["overall"]["tokens_per_s"]
        if name not in sim:
            lines.append(f"{name:<{w}}{'1':>22}{'':>24}{tps:>8.1f}{tps / tps0:>8.2f}x")
            continue
        o = sim[name]["overall"]
        ratio = f"{o['ratio']:.3f}{_ci(o.get('ratio_ci'))}"
        lines.append(f"{name:<{w}}{o['tau']:>6.3f}{_ci(o['tau_ci']):>16}{ratio:>24}{tps:>8.1f}{tps / tps0:>8.2f}x" +
                     "".join(f"{sim[name]['suites'][s]['tau']:>10.3f}" for s in suites))
    h = res["headline"]
    lines.append(f"tau simulated exactly (greedy) on {h['simulated_prompts']} prompts x up to "
                 f"{res['sim']['max_new_tokens']} tokens ({h['simulated_rounds']} DFlash rounds); tokens/s from real "
                 f"decoding of {res['config']['rows']} prompt(s) per suite x {res['config']['max_new_tokens']} "
                 f"tokens.\nPrefix-first oracle tau (DFlash rounds): {h['tau_oracle_prefix_first']:.3f}; "
                 f"DCOCO / DFlash {h['tau_ratio_dcoco_over_dflash']:.3f}x{_ci(h['tau_ratio_ci'])}, frozen-drafter "
                 f"corrector {h['tau_ratio_frozen_over_dflash']:.3f}x{_ci(h['tau_ratio_frozen_ci'])}, DFlash2 selector "
                 f"{h['tau_ratio_dflash2_over_dflash']:.3f}x{_ci(h['tau_ratio_dflash2_ci'])}; "
                 f"lossless: {h['lossless']}")
    for name, c in res.get("costs", {}).items():
        lines.append(f"  {name}: {c['parameters'] / 1e3:.0f}k parameters, {c['flops_per_round']['greedy'] / 1e6:.1f} "
                     f"MFLOP per round (walk; {c['flops_per_round']['grid'] / 1e6:.1f} for the full grid), selection "
                     f"{c['select_ms_per_round']:.2f} ms per round vs {c['argmax_ms_per_round']:.2f} ms for the argmax")
    return "\n".join(lines)


def plots(res: dict, work: Path, out: Path, prefix: str) -> list[Path]:
    """tau per suite per method with 95% CIs, DFlash teacher-forced coverage per slot with counts and Wilson CIs,
    teacher-forced tau while training."""
    plt = figures.pyplot()

    sim = res["sim"]["methods"]
    paths = [out / f"{prefix}-tau.png", out / f"{prefix}-coverage.png", out / f"{prefix}-training.png"]
    names = list(sim)
    suites = [*sim["DFlash"]["suites"], "overall"]
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(suites)), 4.5))
    w = 0.8 / len(names)
    for j, m in enumerate(names):
        rows = [sim[m]["overall"] if s == "overall" else sim[m]["suites"][s] for s in suites]
        ys = [r["tau"] for r in rows]
        err = [[y - r["tau_ci"][0] for y, r in zip(ys, rows)], [r["tau_ci"][1] - y for y, r in zip(ys, rows)]]
        ax.bar([i - 0.4 + w * (j + 0.5) for i in range(len(suites))], ys, width=w, yerr=err, capsize=2, label=m)
    counts = [(sim["DFlash"]["overall"] if s == "overall" else sim["DFlash"]["suites"][s])["prompts"] for s in suites]
    ax.set_xticks(range(len(suites)), [f"{s}\n{n} prompts" for s, n in zip(suites, counts)], rotation=20,
                  ha="right")
    ax.set(ylabel="tau (tokens per round)",
           title="SmolLM2-135M: committed tokens per round\n(greedy, simulated exactly; 95% CIs over prompts)")
    ax.set_ylim(bottom=1.0)
    ax.legend(fontsize=7)
    figures.save(fig, paths[0])
    d = sim["DFlash"]["overall"]
    coverage_plot(d["coverage_tf"], d["coverage_tf_seen"], paths[1],
                  "DFlash drafter: target token in its top-k\n(teacher-forced, every anchor; Wilson 95% CIs)")
    fig, ax = plt.subplots(figsize=(6, 4))
    t = res["training"]  # continued stages are drawn from the step where their drafter's training left off
    base = t["dflash"]["steps"]
    for stage, key, label, x0 in (("dflash", "tau_dflash", "DFlash drafter", 0),
                                  ("dflash-long", "tau_dflash", "DFlash drafter, continued (baseline)", base),
                                  ("dcoco-drafter", "tau_dflash", "DCOCO drafter (joint), argmax", base),
                                  ("dcoco-drafter", "tau_dcoco", "DCOCO drafter (joint) + corrector", base)):
        log = work / stage / "log.jsonl"
        if log.is_file():
            recs = [json.loads(ln) for ln in log.read_text().split("\n") if ln.strip()]
            n = max(1, len(recs) // 25)
            xs = [x0 + recs[i]["step"] for i in range(0, len(recs) - n + 1, n)]
            ys = [sum(r[key] for r in recs[i:i + n]) / n for i in range(0, len(recs) - n + 1, n)]
            ax.plot(xs, ys, label=label)
    ax.set(xlabel="drafter step",
           ylabel="teacher-forced tau", title="training batches (moving mean)")
    ax.legend()
    figures.save(fig, paths[2])
    return paths


def run(size: str = "default", device: str = "cpu", out: str | Path | None = None, suites_dir=None,
        progress: bool = True) -> dict:
    """Everything `dcoco demo` does; writes {out}/demo-smollm2{-size}.json and plots (out: the work folder)."""
    if size not in SIZES:
        raise ValueError(f"size: expected one of {sorted(SIZES)}, got {size!r}")
    s, work = SIZES[size], workdir(size)
    t0 = time.monotonic()
    texts = eval_texts(s.suites, s.sim_rows, suites_dir)  # a missing folder fails before the slow stages
    tok, model = load_target(SMOLLM2)
    prompts = encode(tok, texts)
    model.to(device)
    data = build_corpus(model, s, progress)
    trained = train_all(s, work, data, model, tok, device, progress)
    engines = {name: Engine(model, d.to(device).eval(), None if c is None else c.to(device).eval(), rule=r)
               for name, (d, c, r) in methods(trained, s.rules).items()}
    t1 = time.monotonic()
    refs = simulate.references(model, prompts, s.sim_tokens, next(iter(engines.values())).eos,
                               cache_dir() / "references", progress)
    sim = {"methods": simulate.report(simulate.simulate_all(engines, prompts, refs, s.sim_tokens, progress),
                                      "DFlash"), "max_new_tokens": s.sim_tokens, "seconds": time.monotonic() - t1}
    ev = evaluate_all(model, engines, {n: p[:s.rows] for n, p in prompts.items()}, s.max_new_tokens, progress)
    res = {"size": size, "config": {**dataclasses.asdict(s), "layers": LAYERS, "block_size": BLOCK,
                                    "target_layers": SMOLLM2_TAPS, "device": device,
                                    "corpus_sequences": len(data), "corpus_response_tokens":
                                        int(data.response.sum())},
           "training": {k: v[2] for k, v in trained.items()}, "sim": sim, "eval": ev, "costs": costs(engines)}
    res["headline"] = headline(ev, sim, s.rules)
    res["seconds"] = time.monotonic() - t0
    dest = Path(out) if out else work
    dest.mkdir(parents=True, exist_ok=True)
    prefix = "demo-smollm2" + ("" if size == "full" else f"-{size}")
    (dest / f"{prefix}.json").write_text(json.dumps(res, indent=2) + "\n")
    res["files"] = [str(dest / f"{prefix}.json"), *map(str, plots(res, work, dest, prefix))]
    return res


def show(res: dict) -> None:
    print(table(res))
    print(f"checkpoints: {workdir(res['size'])} (the DCOCO drafter in serving layout: "
          f"{workdir(res['size']) / 'dcoco-drafter'}); wrote {', '.join(res['files'])}")
