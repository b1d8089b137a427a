"""The gain vs drafter strength, and one lever for a stronger drafter per CPU-minute, measured side by side in one
run on the small demo's setting (SmolLM2-135M target, its corpus of 400 sequences, 3 layers,
block 8).

Every drafter trains from the same seed (DFlash loss, 2 sequences x 32 anchors per step); on each frozen drafter's
cached outputs, DCOCO's corrector and DFlash2's selector then train with one contract (frozen.py, as the demo
does). Everything is evaluated by simulated greedy decoding on the demo's evaluation prompts, with paired 95%
bootstrap CIs: tau of each drafter, and tau(corrected) / tau(its drafter) for both correctors.

    .venv/bin/python bench/drafter_study.py --out bench/results/drafter-study

Drafters: "random" at a quarter, half and all of the budget (the small demo's 320 DFlash steps), and
"target-init" (layers and final norm copied from the target's last layers, DFlashDrafter.init_from_target) at the
full budget: the same steps, so the same CPU time."""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from dcoco.experiments import demo
from dcoco.train import frozen
from dcoco import plots
from dcoco.specdec import simulate
from dcoco.target import smollm2
from dcoco.corrector import Corrector
from dcoco.modeling.dflash import DFlashDrafter
from dcoco.specdec.evaluate import encode
from dcoco.target.load import SMOLLM2, load_target
from dcoco.train.recipe import SMOLLM2_TAPS, cache_dir, drafter_config
from dcoco.modeling.selector import CandidateSelector
from dcoco.specdec.engine import Engine
from dcoco.train.training import TrainConfig, train


def drafters(model, tok, budget: int) -> dict[str, tuple[DFlashDrafter, int]]:
    torch.manual_seed(0)
    base = DFlashDrafter(drafter_config(model, tok, demo.LAYERS, SMOLLM2_TAPS, demo.BLOCK, smollm2.MASK_TOKEN_ID))
    init = copy.deepcopy(base)
    init.init_from_target(model)
    out = {f"random {n}": (copy.deepcopy(base), n) for n in (budget // 4, budget // 2, budget)}
    out[f"target-init {budget}"] = (init, budget)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=320, help="DFlash steps of the full budget")
    ap.add_argument("--corrector-steps", type=int, default=150, help="steps of each frozen-drafter corrector")
    ap.add_argument("--rows", type=int, default=32, help="evaluated prompts per suite (the demo's rows < 32)")
    ap.add_argument("--tokens", type=int, default=64, help="max new tokens per evaluated prompt")
    ap.add_argument("--out", default="bench/results/drafter-study")
    args = ap.parse_args()
    size = demo.SIZES["small"]
    tok, model = load_target(SMOLLM2)
    data = demo.build_corpus(model, size, progress=True)
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    prompts = encode(tok, demo.eval_texts(size.suites, args.rows))
    eos = model.config.eos_token_id
    refs = simulate.references(model, prompts, args.tokens, [eos] if isinstance(eos, int) else list(eos or []),
                               cache_dir() / "references")
    rows = {}
    for name, (drafter, steps) in drafters(model, tok, args.budget).items():
        work = cache_dir() / "drafter-study" / name.replace(" ", "-")
        cfg = TrainConfig(mode="drafter", steps=steps, out=str(work), save_every=10 ** 9, save_dtype="float32",
                          log_every=max(1, steps // 10))
        t = time.monotonic()
        d = train(cfg, data, embed, head, drafter).drafter.eval()
        info = {"steps": steps, "train_seconds": time.monotonic() - t}
        cache = frozen.build(d, data, embed, head, anchors=demo.FROZEN_ANCHORS)
        fixes = {}
        for kind, m in (("DCOCO corrector", Corrector(d.config.hidden_size)),
                        ("DFlash2 selector", CandidateSelector(d.config.hidden_size, d.config.vocab_size,
                                                               demo.SELECTOR_RANK))):
            torch.manual_seed(0)
            info[kind] = frozen.train(m, cache, embed, head, args.corrector_steps, demo.FROZEN_BATCH)
            fixes[kind] = m
        engines = {"DFlash": Engine(model, d), **{k: Engine(model, d, m) for k, m in fixes.items()}}
        rep = simulate.report(simulate.simulate_all(engines, prompts, refs, args.tokens), "DFlash")
        rows[name] = {**info, **{m: {k: r["overall"][k] for k in ("tau", "tau_ci", "ratio", "ratio_ci")}
                                 for m, r in rep.items()}}
        print(json.dumps({name: rows[name]}, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"command": f"python bench/drafter_study.py --budget {args.budget} --corrector-steps "
                      f"{args.corrector_steps} --rows {args.rows} --tokens {args.tokens}",
           "prompts": sum(map(len, prompts.values())), "drafters": rows}
    (out / "drafter-study.json").write_text(json.dumps(res, indent=2) + "\n")
    print(table(rows))
    plot(rows, out / "gain-vs-strength.png")
    print(f"wrote {out}")


def table(rows: dict) -> str:
    lines = [f"{'drafter':<18}{'steps':>6}{'tau DFlash [95% CI]':>26}{'DCOCO / DFlash [95% CI]':>28}"
             f"{'DFlash2 / DFlash [95% CI]':>28}"]
    for name, r in rows.items():
        cells = [f"{r['DFlash']['tau']:.3f} [{r['DFlash']['tau_ci'][0]:.3f}, {r['DFlash']['tau_ci'][1]:.3f}]"]
        for m in ("DCOCO corrector", "DFlash2 selector"):
            lo, hi = r[m]["ratio_ci"]
            cells.append(f"{r[m]['ratio']:.3f} [{lo:.3f}, {hi:.3f}]")
        lines.append(f"{name:<18}{r['steps']:>6}{cells[0]:>26}{cells[1]:>28}{cells[2]:>28}")
    return "\n".join(lines)


def plot(rows: dict, path: Path) -> None:
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for m, marker in (("DCOCO corrector", "o"), ("DFlash2 selector", "s")):
        xs = [r["DFlash"]["tau"] for r in rows.values()]
        ys = [r[m]["ratio"] for r in rows.values()]
        err = [[y - r[m]["ratio_ci"][0] for y, r in zip(ys, rows.values())],
               [r[m]["ratio_ci"][1] - y for y, r in zip(ys, rows.values())]]
        ax.errorbar(xs, ys, yerr=err, fmt=marker, capsize=3, label=m)
        for x, y, name in zip(xs, ys, rows):
            ax.annotate(name, (x, y), fontsize=6, xytext=(4, 4), textcoords="offset points")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="tau of the frozen DFlash drafter (simulated, greedy)", ylabel="tau corrected / tau DFlash")
    ax.set_title("Gain vs drafter strength, SmolLM2-135M (paired 95% CIs)", fontsize=9)
    ax.legend(fontsize=7)
    plots.save(fig, path)


if __name__ == "__main__":
    main()
