"""Joint training at the full demo's size: what co-adapting the drafter to the corrector buys, against budget.

Every arm starts from the full demo's stages (`dcoco demo --full` builds the same ones, and this script builds
them when they are missing): dflash (2,600 shortlisted DFlash steps), dflash-long (800 more, the whole head: the
DFlash baseline) and the corrector trained on the frozen dflash-long drafter's cached outputs (1,200 x 256
blocks). The arms:

  frozen-51k      the frozen-drafter corrector with the cold joint stage's budget (200 x 256 = 51,200 blocks)
  cold-cg<w>      the old joint stage: dflash + a fresh corrector, 800 joint steps at lr 6e-4, corr_grad w
  warm-cg<w>      the recipe's schedule: dflash-long + the frozen-trained corrector, `--warm-steps` joint steps at
                  `--warm-lr`, corr_grad w (no loss switch: dflash-long already trains on the whole head). With
                  w = 0 its drafter is dflash-long trained on alone at that schedule: the equal-budget baseline of
                  the other warm arms
  warm-cg<w>-rho<r>  the same with L_corr's position decay rho = r (4: the paper's)
  warm-cg<w>-acc<n>  the same with n micro-batches per optimizer step and n times fewer steps: the same blocks and
                  CPU time, a less noisy gradient (suffixes combine: warm-cg1-rho1-acc4)
  warm-...-anchor the warm arm from the anchor-aware corrector (below), trained with the anchor transition: the
                  co-adapted anchor-aware DCOCO
  anchor          the demo's anchor-aware corrector (beyond the paper: it re-ranks slot 1 against the anchor),
                  trained like the frozen-drafter corrector on the same cached outputs
  dflash2         the demo's DFlash2 selector on the same frozen drafter; with it, every row also gets its ratio
                  over the selector

Each arm is trained once (resumable; stages cached under $DCOCO_CACHE/demo-full/study, the warm arms with the
demo's joint-stage recipe in the demo's own dcoco-drafter and online folders) and simulated once on
`--rows` prompts per suite of the demo's evaluation rows (cached per method); the report puts every method beside
DFlash and beside the frozen-drafter corrector with paired 95% bootstrap CIs, with teacher-forced per-slot top-1
and top-16 coverage, the transition hit rate and the final DFlash loss. `--grads` adds the gradient probe: on a few
batches, the norms of the DFlash loss's and L_corr's gradients on the drafter, their cosine, and how often the
clip bites, at the cold and the warm start.

    .venv/bin/python bench/joint_study.py --arms frozen-51k warm-cg0 warm-cg1 --grads \
        --out bench/results/joint-study/joint-study.json"""

from __future__ import annotations

import argparse
import copy
import json
import re
import time
from pathlib import Path

import torch

from dcoco.experiments import demo
from dcoco import plots as figures
from dcoco.specdec import simulate
from dcoco.corrector import Corrector
from dcoco.specdec.evaluate import encode
from dcoco.target.load import SMOLLM2, load_target
from dcoco.train.recipe import cache_dir
from dcoco.specdec.engine import Engine
from dcoco.train.training import Objective, Schedule, TrainConfig

COLD_LR = TrainConfig.lr
# arms that are demo stages on the frozen drafter, as trained there
BASE_ARMS = {"anchor": "anchor", "dflash2": "dflash2"}


def arm_settings(name: str, warm_steps: int, warm_lr: float, size: demo.Size) -> dict:
    """{"kind": frozen | cold | warm, and its settings} from an arm's name (see the module docstring)."""
    if name in BASE_ARMS:
        return {"kind": "demo stage", "stage": BASE_ARMS[name]}
    m = re.fullmatch(r"frozen-(\d+)k", name)
    if m:
        return {"kind": "frozen", "blocks": int(m[1]) * 1000}
    m = re.fullmatch(r"(cold|warm)-cg([0-9.]+)(?:-rho([0-9.]+))?(?:-acc([0-9]+))?(-anchor)?", name)
    if not m or (m[5] and m[1] == "cold"):
        raise ValueError(f"arm: {name!r} is none of {', '.join(BASE_ARMS)}, frozen-<n>k, cold-cg<w>, "
                         "warm-cg<w>[-rho<r>][-acc<n>][-anchor]")
    cold, accum = m[1] == "cold", int(m[4] or 1)
    steps = size.long_steps if cold else warm_steps
    if accum < 1 or steps % accum:
        raise ValueError(f"arm: {name!r}: acc{accum} must divide the arm's {steps} steps")
    return {"kind": m[1], "corr_grad": float(m[2]), "rho": float(m[3] or 4.0), "grad_accum": accum,
            "steps": steps // accum, "lr": COLD_LR if cold else warm_lr, "anchor": bool(m[5])}


def demo_stage(name: str, st: dict, cfg: TrainConfig, size: demo.Size) -> str:
    """The folder under the demo's work folder: the demo's own joint and online stages for the warm arms that
    have their recipe (one training serves both), study/<name> otherwise."""
    same = cfg == demo.stage_config("joint", size.joint_steps, cfg.device, corr_grad=cfg.corr_grad, lr=demo.JOINT_LR)
    if st["kind"] == "warm" and same and cfg.corr_grad in (demo.JOINT_CORR_GRAD, 0.0):
        return "dcoco-drafter" if cfg.corr_grad == demo.JOINT_CORR_GRAD else "online"
    return f"study/{name}"


def train_arm(name: str, st: dict, base: dict, caches: dict, size: demo.Size, work: Path, data, embed, head,
              progress: bool) -> tuple:
    if st["kind"] == "demo stage":
        return base[st["stage"]]
    if st["kind"] == "frozen":
        return demo.frozen_stage(work / "study" / name, lambda: Corrector(head.shape[1]),
                                 st["blocks"] // demo.FROZEN_BATCH, base["dflash-long"], data, embed, head, "cpu",
                                 caches, progress, drafts=work)
    start, corr = (base["dflash"], None) if st["kind"] == "cold" else (
        base["dflash-long"], base["anchor" if st["anchor"] else "corrector"])
    cfg = demo.stage_config("joint", st["steps"], "cpu", corr_grad=st["corr_grad"], rho=st["rho"], lr=st["lr"],
                            grad_accum=st["grad_accum"], anchor_transition=st["anchor"])
    return demo.train_stage(work / demo_stage(name, st, cfg, size), cfg, data, embed, head, copy.deepcopy(start[0]),
                       None if corr is None else copy.deepcopy(corr[1]), progress=progress,
                       upstream=start[2]["recipe"], corrector_from=None if corr is None else corr[2]["recipe"])


def simulated(engines: dict[str, Engine], prompts, refs, tokens: int, paths: dict[str, Path],
              progress: bool) -> dict[str, dict]:
    """{method: {suite: [Result]}}: each method simulated once (cached in paths[method]); the methods not cached
    yet are simulated together, sharing one target pass per prompt and one draft per drafter."""
    per = {m: torch.load(paths[m], weights_only=False) for m in engines if paths[m].is_file()}
    todo = {m: e for m, e in engines.items() if m not in per}
    if todo:
        for m, r in simulate.simulate_all(todo, prompts, refs, tokens, progress).items():
            paths[m].parent.mkdir(parents=True, exist_ok=True)
            torch.save(r, paths[m].with_suffix(".tmp"))
            paths[m].with_suffix(".tmp").replace(paths[m])
            per[m] = r
    return {m: per[m] for m in engines}


def grad_probe(drafter, corrector, data, embed, head, batches: int, clip: float) -> dict:
    """Per batch of the training schedule: |grad L_DFlash|, |grad L_corr| on the drafter's parameters (the
    paper's unit-weight sum), their cosine, and whether the drafter's clip bites on the sum; plus the norm of the
    mean L_corr gradient over the batches against the mean norm (how much batch noise averages away)."""
    d, c = copy.deepcopy(drafter).float().train(), copy.deepcopy(corrector).float().train()
    cfg = TrainConfig(mode="joint", corr_grad=1.0)
    obj = Objective(d, c, cfg)
    params = [p for p in d.parameters() if p.requires_grad]
    sched = Schedule(data, cfg.seed, cfg.seqs_per_step, 32, 0, 1)
    rows, corr_sum = [], None
    for k in range(batches):
        res = obj(sched.batch(k), embed.float(), head.float())
        gd = torch.autograd.grad(res["dflash"], params, retain_graph=True)
        gc = torch.autograd.grad(res["corr"], params, allow_unused=True)
        gd = torch.cat([g.flatten() for g in gd])
        gc = torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(gc, params)])
        corr_sum = gc if corr_sum is None else corr_sum + gc
        n_d, n_c, n_sum = gd.norm().item(), gc.norm().item(), (gd + gc).norm().item()
        rows.append({"dflash": n_d, "corr": n_c, "cosine": (gd @ gc).item() / max(n_d * n_c, 1e-30),
                     "sum": n_sum, "clipped": n_sum > clip, "dflash_clipped": n_d > clip})
    mean_norm = sum(r["corr"] for r in rows) / batches
    return {"batches": rows, "clip": clip, "clipped_share": sum(r["clipped"] for r in rows) / batches,
            "corr_over_dflash": sum(r["corr"] / r["dflash"] for r in rows) / batches,
            "mean_cosine": sum(r["cosine"] for r in rows) / batches,
            "corr_mean_gradient_norm_over_mean_norm": (corr_sum / batches).norm().item() / max(mean_norm, 1e-30)}


def row(rep: dict, vs_frozen: dict, info: dict | None, vs_selector: dict | None = None) -> dict:
    o, f = rep["overall"], vs_frozen["overall"]
    cov = o.get("coverage_tf", {})
    sel = {} if vs_selector is None else {"ratio_over_dflash2": vs_selector["overall"]["ratio"],
                                          "ratio_over_dflash2_ci": vs_selector["overall"]["ratio_ci"]}
    return {**sel, "tau": o["tau"], "tau_ci": o["tau_ci"], "ratio": o["ratio"], "ratio_ci": o["ratio_ci"],
            "ratio_over_frozen": f["ratio"], "ratio_over_frozen_ci": f["ratio_ci"],
            "top1_per_slot": cov.get(1), "top16_per_slot": cov.get(16),
            "transition_hit_rate": o.get("transition_hit_rate"), "tau_oracle_walk": o.get("tau_oracle_walk"),
            "tau_oracle_prefix_first": o.get("tau_oracle_prefix_first"),
            "final_dflash_loss": (info or {}).get("final_dflash"), "final_corr_loss": (info or {}).get("final_corr"),
            "suites": {s: r["tau"] for s, r in rep["suites"].items()}}


def forest(methods: dict[str, dict], path: Path) -> None:
    """Each method's tau ratio over DFlash and over the frozen-drafter corrector with its paired 95% CI, one row a
    method: which arms separate from which, at a glance."""
    plt = figures.pyplot()
    names = [m for m in methods if m != "DFlash"][::-1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.42 * len(names) + 1.4), sharey=True)
    for ax, key, base in zip(axes, ("ratio", "ratio_over_frozen"), ("DFlash", "the frozen-drafter corrector")):
        for y, m in enumerate(names):
            r, ci = methods[m][key], methods[m][key + "_ci"]
            lo, hi = ci if ci else (r, r)
            ax.errorbar(r, y, xerr=[[r - lo], [hi - r]], fmt="o", capsize=3,
                        color="tab:blue" if "alone" not in m else "tab:gray")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel(f"tau / tau of {base} (paired 95% CI)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(names)), names)
    figures.save(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", default=["frozen-51k", "warm-cg0", "warm-cg1"])
    ap.add_argument("--warm-steps", type=int, default=400)
    ap.add_argument("--warm-lr", type=float, default=3e-4)
    ap.add_argument("--rows", type=int, default=16, help="prompts per suite (8 suites; the demo's rows < 32)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--grads", action="store_true", help="also run the gradient probe")
    ap.add_argument("--grad-batches", type=int, default=8)
    ap.add_argument("--size", default="full", choices=sorted(demo.SIZES), help="the demo size whose stages to use")
    ap.add_argument("--out", default="bench/results/joint-study/joint-study.json",
                    help="the JSON; the figure beside it (.png)")
    args = ap.parse_args()
    t0, size, work = time.monotonic(), demo.SIZES[args.size], demo.workdir(args.size)
    settings = {a: arm_settings(a, args.warm_steps, args.warm_lr, size) for a in args.arms}  # bad names fail first
    tok, model = load_target(SMOLLM2)
    data = demo.build_corpus(model, size, progress=True)
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    base, caches = demo.baseline_stages(size, work, data, model, tok, "cpu", True)
    res = {"command": "python bench/joint_study.py " + " ".join(
        [f"--arms {' '.join(args.arms)}", f"--warm-steps {args.warm_steps}", f"--warm-lr {args.warm_lr:g}",
         f"--rows {args.rows}", f"--tokens {args.tokens}", f"--size {args.size}"] +
        (["--grads"] if args.grads else [])),
        "arms": settings, "training": {k: base[k][2] for k in ("dflash", "dflash-long", "corrector")}}
    if args.grads:
        fresh = Corrector(head.shape[1])
        res["gradients"] = {
            "cold (dflash + fresh corrector)": grad_probe(base["dflash"][0], fresh, data, embed, head,
                                                          args.grad_batches, TrainConfig.clip),
            "warm (dflash-long + frozen-trained corrector)": grad_probe(base["dflash-long"][0], base["corrector"][1],
                                                                       data, embed, head, args.grad_batches,
                                                                       TrainConfig.clip)}
    trained = {a: train_arm(a, s, base, caches, size, work, data, embed, head, True)
               for a, s in settings.items()}
    res["training"].update({a: t[2] for a, t in trained.items()})
    methods = {"DFlash": (base["dflash-long"][0], None, None),
               demo.FROZEN: base["corrector"]}
    for a, (d, c, info) in trained.items():
        methods[a] = (d, c, info)
        if settings[a]["kind"] in ("cold", "warm"):
            methods[f"{a}, drafter alone"] = (d, None, info)
    prompts = encode(tok, demo.eval_texts(size.suites, args.rows))
    refs = simulate.references(model, prompts, args.tokens, Engine(model, base["dflash"][0]).eos,
                               cache_dir() / "references")
    slug = {m: re.sub(r"[^a-z0-9]+", "-", m.lower()).strip("-") for m in methods}
    per = simulated({m: Engine(model, d.eval(), None if c is None else c.eval()) for m, (d, c, _) in methods.items()},
                    prompts, refs, args.tokens,
                    {m: work / "study" / "sim" / f"{slug[m]}-r{args.rows}-t{args.tokens}.pt" for m in methods}, True)
    rep, vs_frozen = simulate.report(per, "DFlash"), simulate.report(per, demo.FROZEN)
    vs_sel = simulate.report(per, "dflash2") if "dflash2" in methods else None
    res["prompts"] = sum(map(len, prompts.values()))
    res["methods"] = {m: row(rep[m], vs_frozen[m], methods[m][2], vs_sel and vs_sel[m]) for m in methods}
    res["seconds"] = time.monotonic() - t0
    print(f"{'method':<40}{'tau':>7}{'vs DFlash [95% CI]':>26}{'vs frozen [95% CI]':>26}{'top1 s1':>9}{'s2':>6}")
    for m, r in res["methods"].items():
        def with_ci(k: str) -> str:
            return f"{r[k]:.3f} [{r[k + '_ci'][0]:.3f}, {r[k + '_ci'][1]:.3f}]" if r[k + "_ci"] else f"{r[k]:.3f}"  # noqa: B023 (called in this iteration)

        ci = [with_ci(k) for k in ("ratio", "ratio_over_frozen")]
        t1 = r["top1_per_slot"] or [None, None]
        sel = f"  / dflash2 {with_ci('ratio_over_dflash2')}" if r.get("ratio_over_dflash2_ci") else ""
        print(f"{m:<40}{r['tau']:>7.3f}{ci[0]:>26}{ci[1]:>26}{t1[0]:>9.3f}{t1[1]:>6.3f}{sel}")
    d = res["methods"]["DFlash"]
    print(f"oracles (DFlash rounds): prefix-first {d['tau_oracle_prefix_first']:.3f}, any candidate "
          f"{d['tau_oracle_walk']:.3f}")
    for start, g in res.get("gradients", {}).items():
        print(f"gradients, {start}: |corr| / |dflash| {g['corr_over_dflash']:.3f}, cosine {g['mean_cosine']:.3f}, "
              f"clip bites {g['clipped_share']:.0%}, noise (|mean| / mean||) "
              f"{g['corr_mean_gradient_norm_over_mean_norm']:.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    forest(res["methods"], Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out} and its figure ({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
