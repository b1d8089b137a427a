"""The joint schedule on the demo's default setting: how much of L_corr's gradient should reach the drafter.

Starts from the default demo's cached stages (run `dcoco demo` first): its 200-step DFlash drafter is trained
jointly with a fresh corrector for the demo's 120 joint steps at each corr_grad weight, and compared by simulated
greedy decoding with the demo's baseline (the same drafter trained alone for those 120 steps), with paired 95%
bootstrap CIs, on the demo's evaluation prompts.

    .venv/bin/python bench/joint_schedule.py --weights 0 0.1 1 --out bench/results/joint-schedule.json"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from dcoco import checkpoint, demo, simulate
from dcoco.evaluate import encode
from dcoco.recipe import SMOLLM2, cache_dir, load_target
from dcoco.spec import Engine
from dcoco.training import TrainConfig, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.1, 1.0])
    ap.add_argument("--rows", type=int, default=16, help="evaluated prompts per suite (the demo's rows < 32)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default="bench/results/joint-schedule.json")
    args = ap.parse_args()
    size, work = demo.SIZES["default"], demo.workdir("default")
    if not (work / "dflash-long" / "done.json").is_file():
        raise SystemExit(f"run `dcoco demo` first: no finished default stages under {work}")
    tok, model = load_target(SMOLLM2)
    data = demo.build_corpus(model, size, progress=True)
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    engines = {"DFlash": Engine(model, checkpoint.load(work / "dflash-long")[0].eval())}
    for w in args.weights:
        out = cache_dir() / "joint-schedule" / f"corr-grad-{w:g}"
        cfg = TrainConfig(mode="joint", steps=size.joint_steps, out=str(out), corr_grad=w, save_every=10 ** 9,
                          log_every=max(1, size.joint_steps // 10), save_dtype="float32")
        resume = (out / "train_state.pt").is_file()
        cfg = dataclasses.replace(cfg, resume=resume, overwrite=not resume)
        res = train(cfg, data, embed, head, checkpoint.load(work / "dflash")[0])
        engines[f"DCOCO, corr_grad {w:g}"] = Engine(model, res.drafter.eval(), res.corrector.eval())
        engines[f"its drafter alone, corr_grad {w:g}"] = Engine(model, res.drafter)
    prompts = encode(tok, demo.eval_texts(size.suites, args.rows))
    refs = simulate.references(model, prompts, args.tokens, engines["DFlash"].eos, cache_dir() / "references")
    rep = simulate.report(simulate.simulate_all(engines, prompts, refs, args.tokens), "DFlash")
    rows = {m: {k: r["overall"][k] for k in ("tau", "tau_ci", "ratio", "ratio_ci")} for m, r in rep.items()}
    for m, r in rows.items():
        ci = "" if not r["ratio_ci"] else f" [{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]"
        print(f"{m:<36}{r['tau']:.3f}   {r['ratio']:.3f}{ci}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    command = f"python bench/joint_schedule.py --weights {' '.join(f'{w:g}' for w in args.weights)} --rows {args.rows}"
    res = {"command": command, "prompts": sum(map(len, prompts.values())), "methods": rows}
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
