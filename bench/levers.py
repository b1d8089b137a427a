"""Levers for a stronger DFlash drafter per CPU-minute, measured side by side in one run.

Every lever trains one drafter from the same seed (DFlash loss only) for the same budget of CPU time: short
calibration runs measure its CPU seconds per step, and its cosine schedule is then that many steps long, so each
lever gets a whole schedule for about the same CPU time. All drafters are evaluated by simulated greedy decoding
(simulate.py) on the demo's evaluation prompts, with tau over the baseline's and paired 95% bootstrap CIs.

Two settings:
- the small demo's setting (SmolLM2-135M target, the first 400 shipped sequences, cached features, 2 sequences x 32
  anchors per step): `.venv/bin/python bench/levers.py --budget 480 --out bench/results/levers`;
- `--scale`: the committed corpus (python/dcoco/data/smollm2-corpus) with online features, as
  recipes/smollm2-scale.toml trains (2 sequences x 128 anchors, the 4,096-token loss, labels from the corpus), its
  drafter against depth 5, the loss decay gamma 7 and distillation from the target's top 16:
  `.venv/bin/python bench/levers.py --scale --budget 3600 --out bench/results/levers-scale`."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
import tempfile
import time
from pathlib import Path

import torch

from dcoco.target import corpus, smollm2
from dcoco.experiments import demo
from dcoco.specdec import simulate
from dcoco.modeling.dflash import DFlashDrafter
from dcoco.specdec.evaluate import encode
from dcoco.target.features import TargetFeatures, TokenCorpus
from dcoco.target.load import SMOLLM2, load_target
from dcoco.train import datagen
from dcoco.train.recipe import SMOLLM2_TAPS, cache_dir, drafter_config
from dcoco.specdec.engine import Engine
from dcoco.train.training import TrainConfig, train


@dataclasses.dataclass(frozen=True)
class Lever:
    layers: int = demo.LAYERS
    block: int = demo.BLOCK
    taps: tuple[int, ...] = tuple(SMOLLM2_TAPS)
    target_init: bool = False
    loss_vocab: int | None = None
    sequences: int | None = 400  # of the shipped corpus (None: all 1,020, the --full demo's)
    gamma: float = 7.0
    distill: int | None = None  # the target's top-n distribution as the loss's target (online features only)


LEVERS = {  # the demo's drafter first: every ratio is over it
    "baseline (demo: 3 layers, block 8, taps 1/15/27)": Lever(),
    "loss over 4,096 frequent tokens": Lever(loss_vocab=4096),
    "loss over 1,024 frequent tokens": Lever(loss_vocab=1024),
    "init from the target's last layers": Lever(target_init=True),
    "block 16": Lever(block=16),
    "2 layers": Lever(layers=2),
    "5 layers": Lever(layers=5),
    "5 taps 1/8/15/22/27": Lever(taps=(1, 8, 15, 22, 27)),
    "loss over 4,096 frequent tokens, all 1,020 sequences": Lever(loss_vocab=4096, sequences=None),
}
SCALE = Lever(loss_vocab=4096, gamma=4.0, sequences=None)  # recipes/smollm2-scale.toml's drafter
SCALE_LEVERS = {
    "baseline (the scale recipe's: 3 layers, block 8, gamma 4, CE on the target's argmax)": SCALE,
    "5 layers": dataclasses.replace(SCALE, layers=5),
    "gamma 7": dataclasses.replace(SCALE, gamma=7.0),
    "distillation from the target's top 16": dataclasses.replace(SCALE, distill=16),
}


def cpu_seconds_per_step(cfg: TrainConfig, data, embed, head, drafter: DFlashDrafter,
                         target: TargetFeatures | None = None) -> float:
    """CPU seconds (this process, all threads) of one step: a 9-step run minus a 3-step one, in throwaway runs,
    so start-up is not counted. CPU time, not wall time, so that other work on the machine shifts it little."""
    spent = []
    for steps in (3, 9):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.process_time()
            train(dataclasses.replace(cfg, steps=steps, out=tmp), data, embed, head, copy.deepcopy(drafter),
                  progress=False, target=target)
            spent.append(time.process_time() - t)
    return max(1e-3, (spent[1] - spent[0]) / 6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", action="store_true",
                    help="the scale recipe's setting: the committed corpus, online features, its levers")
    ap.add_argument("--budget", type=float, default=480.0,
                    help="training CPU seconds per lever (both cores: about half as many seconds of wall time)")
    ap.add_argument("--rows", type=int, default=16, help="evaluated prompts per suite (the demo's rows < 32)")
    ap.add_argument("--tokens", type=int, default=64, help="max new tokens per evaluated prompt")
    ap.add_argument("--only", nargs="*", help="lever names to run (default: all); the baseline always runs")
    ap.add_argument("--out", default="bench/results/levers")
    args = ap.parse_args()
    size = demo.SIZES["small"]
    tok, model = load_target(SMOLLM2)
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    corpora: dict = {}

    def data_for(lv: Lever) -> tuple[corpus.Corpus | TokenCorpus, TargetFeatures | None]:
        """The lever's training data and, for online features, the target that computes them. A feature cache
        is built once per (taps, sequences), outside the budget; online features are inside it, as in training."""
        if args.scale:
            if "scale" not in corpora:
                corpora["scale"] = TokenCorpus(datagen.load(smollm2.corpus_dir(), embed.shape[0]))
            return corpora["scale"], TargetFeatures(model, list(lv.taps), torch.device("cpu"), labels="corpus",
                                                    teacher=lv.distill or 0)
        if (lv.taps, lv.sequences) not in corpora:
            corpora[lv.taps, lv.sequences] = demo.build_corpus(model, dataclasses.replace(size, sequences=lv.sequences),
                                                               True, lv.taps)
        return corpora[lv.taps, lv.sequences], None

    prompts = encode(tok, demo.eval_texts(size.suites, args.rows))
    eos = corpus.token_ids(model.config.eos_token_id)
    refs = simulate.references(model, prompts, args.tokens, eos, cache_dir() / "references")
    every = SCALE_LEVERS if args.scale else LEVERS
    levers = {n: lv for i, (n, lv) in enumerate(every.items()) if i == 0 or not args.only or n in args.only}
    rows, engines = {}, {}
    for name, lv in levers.items():
        data, target = data_for(lv)
        torch.manual_seed(0)
        drafter = DFlashDrafter(drafter_config(model, tok, lv.layers, list(lv.taps), lv.block, smollm2.MASK_TOKEN_ID))
        if lv.target_init:
            drafter.init_from_target(model)
        cfg = TrainConfig(mode="drafter", steps=1, save_every=10 ** 9, save_dtype="float32", loss_vocab=lv.loss_vocab,
                          gamma=lv.gamma, distill=lv.distill, anchors=128 if args.scale else None)
        sps = cpu_seconds_per_step(cfg, data, embed, head, drafter, target)
        steps = max(10, int(args.budget / sps))
        t, c = time.monotonic(), time.process_time()
        runs = cache_dir() / ("levers-scale" if args.scale else "levers")
        cfg = dataclasses.replace(cfg, steps=steps, log_every=max(1, steps // 10), overwrite=True,
                                  out=str(runs / re.sub(r"[^A-Za-z0-9]+", "-", name)))
        d = train(cfg, data, embed, head, drafter, target=target).drafter.eval()
        rows[name] = {**dataclasses.asdict(lv), "cpu_seconds_per_step": sps, "steps": steps,
                      "train_cpu_seconds": time.process_time() - c, "train_seconds": time.monotonic() - t}
        engines[name] = Engine(model, d)
        print(json.dumps({name: rows[name]}))
    base = next(iter(levers))
    rep = simulate.report(simulate.simulate_all(engines, prompts, refs, args.tokens), base)
    for name, r in rep.items():
        rows[name].update({k: r["overall"][k] for k in ("tau", "tau_ci", "ratio", "ratio_ci")})
        rows[name]["suites"] = {s: v["tau"] for s, v in r["suites"].items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"command": f"python bench/levers.py{' --scale' if args.scale else ''} --budget {args.budget:g} "
                      f"--rows {args.rows} --tokens {args.tokens}",
           "prompts": sum(map(len, prompts.values())), "levers": rows}
    (out / "levers.json").write_text(json.dumps(res, indent=2) + "\n")
    print(table(rows))
    print(f"wrote {out}")


def table(rows: dict) -> str:
    lines = ["| lever | CPU s/step | steps | tau DFlash [95% CI] | vs baseline [paired 95% CI] |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        ci = r["ratio_ci"] or (1.0, 1.0)
        lines.append(f"| {name} | {r['cpu_seconds_per_step']:.2f} | {r['steps']} | {r['tau']:.3f} "
                     f"[{r['tau_ci'][0]:.3f}, {r['tau_ci'][1]:.3f}] | {r['ratio']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
