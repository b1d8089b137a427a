"""Levers for a stronger DFlash drafter per CPU-minute, measured side by side in one run on the demo's default
setting (SmolLM2-135M target, the default demo corpus, 3 layers, block 8): each variant trains a drafter from the
same seed for the same number of steps, then every drafter is evaluated by simulated greedy decoding on the same
prompts (the demo's evaluation rows), with tau / tau(baseline) and its paired 95% bootstrap CI.

    .venv/bin/python bench/drafter_levers.py --steps 200 --out bench/results/drafter-levers.json

Variants: baseline (random init, what the demo does today); target-init (the drafter's layers and final norm
copied from the target's last layers, DFlashDrafter.init_from_target)."""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from dcoco import demo, simulate, smollm2
from dcoco.dflash import DFlashDrafter
from dcoco.evaluate import encode
from dcoco.recipe import SMOLLM2, SMOLLM2_TAPS, cache_dir, drafter_config, load_target
from dcoco.spec import Engine
from dcoco.training import TrainConfig, train


def variants(model, tok) -> dict[str, DFlashDrafter]:
    torch.manual_seed(0)
    base = DFlashDrafter(drafter_config(model, tok, demo.LAYERS, SMOLLM2_TAPS, demo.BLOCK, smollm2.MASK_TOKEN_ID))
    init = copy.deepcopy(base)
    init.init_from_target(model)
    return {"baseline": base, "target-init": init}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="training steps per variant (2 sequences x 32 anchors)")
    ap.add_argument("--rows", type=int, default=32, help="evaluated prompts per suite (the demo's rows < 32)")
    ap.add_argument("--tokens", type=int, default=64, help="max new tokens per evaluated prompt")
    ap.add_argument("--out", default="bench/results/drafter-levers.json")
    args = ap.parse_args()
    size = demo.SIZES["default"]
    tok, model = load_target(SMOLLM2)
    data = demo.build_corpus(model, size, progress=True)
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    trained, info = {}, {}
    for name, drafter in variants(model, tok).items():
        out = cache_dir() / "levers" / f"{name}-{args.steps}"
        cfg = TrainConfig(mode="drafter", steps=args.steps, out=str(out), save_every=10 ** 9, save_dtype="float32",
                          log_every=max(1, args.steps // 10))
        t = time.monotonic()
        trained[name] = train(cfg, data, embed, head, drafter).drafter.eval()
        info[name] = {"steps": args.steps, "seconds": time.monotonic() - t}
    prompts = encode(tok, demo.eval_texts(size.suites, args.rows))
    engines = {name: Engine(model, d) for name, d in trained.items()}
    refs = simulate.references(model, prompts, args.tokens, engines["baseline"].eos, cache_dir() / "references")
    rep = simulate.report(simulate.simulate_all(engines, prompts, refs, args.tokens), "baseline")
    print(f"{'variant':<14}{'steps':>7}{'train s':>9}{'tau [95% CI]':>24}{'vs baseline [95% CI]':>26}")
    for name, r in rep.items():
        o = r["overall"]
        ci = "" if not o.get("ratio_ci") else f" [{o['ratio_ci'][0]:.3f}, {o['ratio_ci'][1]:.3f}]"
        print(f"{name:<14}{info[name]['steps']:>7}{info[name]['seconds']:>9.0f}"
              f"{o['tau']:>8.3f} [{o['tau_ci'][0]:.3f}, {o['tau_ci'][1]:.3f}]{o['ratio']:>10.3f}{ci}")
    res = {"command": f"python bench/drafter_levers.py --steps {args.steps} --rows {args.rows} --tokens "
                      f"{args.tokens}", "training": info,
           "eval": {n: {"overall": {k: r["overall"][k] for k in ("tau", "tau_ci", "ratio", "ratio_ci", "prompts",
                                                                  "rounds", "coverage_tf")}} for n, r in rep.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
