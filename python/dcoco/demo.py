"""`dcoco demo`: the paper's experiment at small scale on the embedded SmolLM2-135M-Instruct target, offline,
CPU or GPU.

1. corpus: the target's own greedy responses shipped as token ids (data/smollm2-corpus.npz, made by
   scripts/make_demo_corpus.py); one teacher-forced target pass computes features and labels here.
2. DFlash: a drafter trained alone (DFlash loss), `steps` steps.
3. DCOCO, the paper's recipe: that drafter trained on jointly with a fresh corrector (DFlash loss + L_corr) for
   `joint_steps` more steps. The DFlash baseline gets the same budget: the same drafter trained on alone for
   `joint_steps` more steps (dflash-long), so extra training is not credited to the corrector.
4. corrector: a corrector trained on the frozen dflash-long drafter (L_corr only): the baseline, corrected.
5. eval: prompts from rows of ../shared/data/eval that no training prompt came from, decoded target-only and
   by every method in turn (same machine state): tau, tokens/s, speedup, coverage, the prefix-first oracle, and
   a greedy losslessness check.

Every stage is cached under $DCOCO_CACHE (~/.cache/dcoco): the corpus under corpus/, the trained checkpoints
(serving layout) under demo/ (demo-full/, demo-smoke/ for the other sizes); an interrupted run resumes and a
second run only evaluates."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import time
from importlib import resources
from pathlib import Path

from . import checkpoint, corpus, smollm2
from . import plots as figures  # demo.plots draws the demo's figures
from .corrector import Corrector
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

    def __post_init__(self):
        assert self.rows <= EVAL_ROWS_RESERVED, "evaluated rows must stay clear of the training rows"


ALL_SUITES = ("gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench", "mt-bench", "arena-hard-v2")
SIZES = {
    "smoke": Size(16, 3, 2, 2, ("gsm8k", "mbpp"), 1, 12, ("greedy",)),
    "default": Size(400, 200, 120, 150, ("gsm8k", "math500", "humaneval", "mt-bench"), 2, 48, ("greedy",)),
    "full": Size(None, 1300, 800, 1200, ALL_SUITES, 4, 64, ("greedy", "global", "geometric")),
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


def build_corpus(model, size: Size, progress: bool) -> corpus.Corpus:
    """The shipped sequences (the first size.sequences) with this machine's features and labels, cached."""
    seqs = corpus.load_sequences(resources.files("dcoco") / "data" / CORPUS_FILE)[:size.sequences]
    settings = corpus.CorpusSettings(tuple(SMOLLM2_TAPS), max_new_tokens=128)
    return corpus.build_corpus(model, [p for p, _ in seqs], cache_dir() / "corpus", settings, progress=progress,
                               responses=[r for _, r in seqs])


def _stage(out: Path, cfg: TrainConfig, data: corpus.Corpus, embed, head, drafter, corrector=None,
           progress: bool = True) -> tuple[DFlashDrafter, Corrector | None, dict]:
    """Train once: a finished stage (done.json) is loaded, an interrupted one resumed."""
    done = out / "done.json"
    if done.is_file():
        d, c = checkpoint.load(out)
        return d, c, json.loads(done.read_text())
    t = time.monotonic()
    cfg = dataclasses.replace(cfg, out=str(out), resume=(out / "train_state.pt").is_file())
    res = train(cfg, data, embed, head, drafter, corrector, progress=progress)
    last = res.history[-20:] or [{}]
    info = {"mode": cfg.mode, "steps": res.step, "seconds": time.monotonic() - t,
            **{f"final_{k}": sum(r[k] for r in last) / len(last) for k in last[0] if k not in ("step", "lr")}}
    done.write_text(json.dumps(info, indent=2) + "\n")
    return res.drafter, res.corrector, info


def train_all(size: Size, work: Path, data: corpus.Corpus, model, tok, device: str, progress: bool) -> dict:
    """{name: (drafter, corrector, info)} for dflash (from scratch), dflash-long (dflash + joint_steps DFlash-only
    steps: the baseline), dcoco-drafter (dflash + joint_steps joint steps with a fresh corrector) and corrector
    (on the frozen dflash-long drafter). Training mutates its drafter, hence the copies."""
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()
    dcfg = drafter_config(model, tok, LAYERS, SMOLLM2_TAPS, BLOCK, smollm2.MASK_TOKEN_ID)

    def cfg(mode, steps):
        return TrainConfig(mode=mode, steps=steps, device=device, save_every=100, log_every=max(1, steps // 10),
                           save_dtype="float32")  # later stages and the evaluation reload these exactly

    out = {"dflash": _stage(work / "dflash", cfg("drafter", size.steps), data, embed, head, dcfg, progress=progress)}
    for name, mode in (("dflash-long", "drafter"), ("dcoco-drafter", "joint")):
        out[name] = _stage(work / name, cfg(mode, size.joint_steps), data, embed, head,
                           copy.deepcopy(out["dflash"][0]), progress=progress)
    out["corrector"] = _stage(work / "corrector", cfg("corrector", size.corrector_steps), data, embed, head,
                              out["dflash-long"][0], progress=progress)
    return out


def methods(trained: dict, rules: tuple[str, ...]) -> dict[str, tuple]:
    """{method: (drafter, corrector or None, rule)}, DFlash (the baseline with DCOCO's budget) first."""
    d0, _, _ = trained["dflash-long"]
    d1, c1, _ = trained["dcoco-drafter"]
    _, c2, _ = trained["corrector"]
    out = {"DFlash": (d0, None, "greedy")}
    out.update({f"DCOCO {r}": (d1, c1, r) for r in rules})
    out["DCOCO drafter, corrector off"] = (d1, None, "greedy")
    out["DFlash + corrector (frozen drafter)"] = (d0, c2, "greedy")
    return out


def eval_texts(names: tuple[str, ...], rows: int, suites_dir=None) -> dict[str, list[str]]:
    """The first rows of each named suite found in suites_dir (default ../shared/data/eval, the paper's suites;
    without them, the small held-out set shipped in data/eval, written for dcoco and never trained on)."""
    root = Path(suites_dir) if suites_dir else default_suites()
    if not suites_dir and not root.is_dir():
        print(f"dcoco demo: no evaluation suites at {root}; evaluating dcoco's own held-out prompts instead "
              f"(pass --suites for others)")
        root = Path(str(resources.files("dcoco") / "data" / "eval"))
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


def headline(ev: dict, rules: tuple[str, ...]) -> dict:
    """The issue's keys: tau / tokens per second of target-only, DFlash and DCOCO (the jointly trained drafter
    with its corrector, greedy rule), the prefix-first oracle tau and coverage of the DFlash run."""
    m = ev["methods"]
    base, dfl, dco = m["target-only"]["overall"], m["DFlash"]["overall"], m[f"DCOCO {rules[0]}"]["overall"]
    frozen = m["DFlash + corrector (frozen drafter)"]["overall"]
    oracle = dfl["tau_oracle_prefix_first"]

    def captured(t):
        return (t - dfl["tau"]) / (oracle - dfl["tau"]) if oracle and oracle > dfl["tau"] else None

    return {"tau_target_only": 1.0, "tau_dflash": dfl["tau"], "tau_dcoco": dco["tau"],
            "tau_dcoco_frozen_drafter": frozen["tau"], "tau_oracle_prefix_first": oracle,
            "tau_oracle_walk": dfl["tau_oracle_walk"], "tps_target_only": base["tokens_per_s"],
            "tps_dflash": dfl["tokens_per_s"], "tps_dcoco": dco["tokens_per_s"],
            "tps_dcoco_frozen_drafter": frozen["tokens_per_s"], "tau_ratio_dcoco_over_dflash": dco["tau"] / dfl["tau"],
            "tau_ratio_frozen_over_dflash": frozen["tau"] / dfl["tau"],
            "headroom_captured_dcoco": captured(dco["tau"]), "headroom_captured_frozen": captured(frozen["tau"]),
            "speedup_dcoco_over_dflash": dco["tokens_per_s"] / dfl["tokens_per_s"],
            "coverage": dfl["coverage"], "lossless": ev["lossless"]}


def table(res: dict) -> str:
    """Per method: tau overall and per suite, tokens/s, speedup over target-only."""
    ev = res["eval"]
    suites = list(ev["methods"]["DFlash"]["suites"])
    tps0 = ev["methods"]["target-only"]["overall"]["tokens_per_s"]
    head = f"{'method':<38}{'tau':>6}{'tok/s':>8}{'speedup':>9}" + "".join(f"{s[:9]:>10}" for s in suites)
    lines = [head, "-" * len(head)]
    for name, m in ev["methods"].items():
        o = m["overall"]
        tau = "-" if o["tau"] is None else f"{o['tau']:.3f}"
        lines.append(f"{name:<38}{tau:>6}{o['tokens_per_s']:>8.1f}{o['tokens_per_s'] / tps0:>8.2f}x" +
                     "".join(f"{'-' if m['suites'][s]['tau'] is None else format(m['suites'][s]['tau'], '.3f'):>10}"
                             for s in suites))
    h = res["headline"]
    lines.append(f"prefix-first oracle tau (DFlash run): {h['tau_oracle_prefix_first']:.3f}; DCOCO / DFlash tau "
                 f"{h['tau_ratio_dcoco_over_dflash']:.3f}x, frozen-drafter corrector {h['tau_ratio_frozen_over_dflash']:.3f}x; "
                 f"lossless: {h['lossless']}")
    return "\n".join(lines)


def plots(res: dict, work: Path, out: Path, prefix: str) -> list[Path]:
    """tau per suite per method, DFlash coverage per slot, teacher-forced tau while training."""
    plt = figures.pyplot()

    ev = res["eval"]
    paths = [out / f"{prefix}-tau.png", out / f"{prefix}-coverage.png", out / f"{prefix}-training.png"]
    names = [m for m in ev["methods"] if m != "target-only"]
    suites = [*ev["methods"]["DFlash"]["suites"], "overall"]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(suites)), 4.5))
    w = 0.8 / len(names)
    for j, m in enumerate(names):
        rows = ev["methods"][m]
        ys = [(rows["overall"] if s == "overall" else rows["suites"][s])["tau"] or float("nan") for s in suites]
        ax.bar([i - 0.4 + w * (j + 0.5) for i in range(len(suites))], ys, width=w, label=m)
    ax.set_xticks(range(len(suites)), suites, rotation=20, ha="right")
    ax.set(ylabel="tau (tokens per round)", title="SmolLM2-135M: mean committed tokens per round")
    ax.set_ylim(bottom=1.0)
    ax.legend(fontsize=7)
    figures.save(fig, paths[0])
    coverage_plot(ev["methods"]["DFlash"]["overall"].get("coverage"), paths[1],
                  "DFlash drafter: verifier token in its top-k")
    fig, ax = plt.subplots(figsize=(6, 4))
    t = res["training"]  # continued stages are drawn from the step where their drafter's training left off
    base, long = t["dflash"]["steps"], t["dflash"]["steps"] + t["dflash-long"]["steps"]
    for stage, key, label, x0 in (("dflash", "tau_dflash", "DFlash drafter", 0),
                                  ("dflash-long", "tau_dflash", "DFlash drafter, continued (baseline)", base),
                                  ("dcoco-drafter", "tau_dflash", "DCOCO drafter (joint), argmax", base),
                                  ("dcoco-drafter", "tau_dcoco", "DCOCO drafter (joint) + corrector", base),
                                  ("corrector", "tau_dcoco", "frozen baseline drafter + corrector", long)):
        log = work / stage / "log.jsonl"
        if log.is_file():
            recs = [json.loads(ln) for ln in log.read_text().split("\n") if ln.strip()]
            n = max(1, len(recs) // 25)
            xs = [x0 + recs[i]["step"] for i in range(0, len(recs) - n + 1, n)]
            ys = [sum(r[key] for r in recs[i:i + n]) / n for i in range(0, len(recs) - n + 1, n)]
            ax.plot(xs, ys, label=label)
    ax.set(xlabel="drafter step (the frozen-drafter corrector starts after the baseline's)",
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
    texts = eval_texts(s.suites, s.rows, suites_dir)  # a missing folder fails before the slow stages
    tok, model = load_target(SMOLLM2)
    prompts = encode(tok, texts)
    model.to(device)
    data = build_corpus(model, s, progress)
    trained = train_all(s, work, data, model, tok, device, progress)
    engines = {name: Engine(model, d.to(device).eval(), None if c is None else c.to(device).eval(), rule=r)
               for name, (d, c, r) in methods(trained, s.rules).items()}
    ev = evaluate_all(model, engines, prompts, s.max_new_tokens, progress)
    res = {"size": size, "config": {**dataclasses.asdict(s), "layers": LAYERS, "block_size": BLOCK,
                                    "target_layers": SMOLLM2_TAPS, "device": device,
                                    "corpus_sequences": len(data), "corpus_response_tokens":
                                        int(data.response.sum())},
           "training": {k: v[2] for k, v in trained.items()}, "eval": ev}
    res["headline"] = headline(ev, s.rules)
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
