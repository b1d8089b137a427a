"""Levers for a stronger DFlash drafter per CPU-minute, measured side by side in one run on the
demo's default setting (SmolLM2-135M target, the default demo corpus: the first 400 shipped sequences).

Every lever trains one drafter from the same seed (DFlash loss only, 2 sequences x 32 anchors per step) for the
same budget of CPU time: short calibration runs measure its CPU seconds per step, and its cosine schedule is then
that many steps long, so each lever gets a whole schedule for about the same CPU time. All drafters are evaluated by
simulated greedy decoding (simulate.py) on the demo's evaluation prompts, with tau over the baseline's and
paired 95% bootstrap CIs.

    .venv/bin/python bench/levers.py --budget 480 --out bench/results/levers"""

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
from dcoco.target.load import SMOLLM2, load_target
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


def cpu_seconds_per_step(cfg: TrainConfig, data, embed, head, drafter: DFlashDrafter) -> float:
    """CPU seconds (this process, all threads) of one step: a 9-step run minus a 3-step one, in throwaway runs,
    so start-up is not counted. CPU time, not wall time, so that other work on the machine shifts it little."""
    spent = []
    for steps in (3, 9):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.process_time()
            train(dataclasses.replace(cfg, steps=steps, out=tmp), data, embed, head, copy.deepcopy(drafter),
                  progress=False)
            spent.append(time.process_time() - t)
    return max(1e-3, (spent[1] - spent[0]) / 6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=480.0,
                    help="training CPU seconds per lever (both cores: about half as many seconds of wall time)")
    ap.add_argument("--rows", type=int, default=16, help="evaluated prompts per suite (the demo's rows < 32)")
    ap.add_argument("--tokens", type=int, default=64, help="max new tokens per evaluated prompt")
    ap.add_argument("--only", nargs="*", help="lever names to run (default: all); the baseline always runs")
    ap.add_argument("--out", default="bench/results/levers")
    args = ap.parse_args()
    size = demo.SIZES["default"]
    tok, model = load_target(SMOLLM2)
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    corpora = {}

    def data_for(lv: Lever) -> corpus.Corpus:  # features are built once per (taps, sequences), not in the budget
        if (lv.taps, lv.sequences) not in corpora:
            corpora[lv.taps, lv.sequences] = demo.build_corpus(model, dataclasses.replace(size, sequences=lv.sequences),
                                                               True, lv.taps)
        return corpora[lv.taps, lv.sequences]

    prompts = encode(tok, demo.eval_texts(size.suites, args.rows))
    eos = corpus.token_ids(model.config.eos_token_id)
    refs = simulate.references(model, prompts, args.tokens, eos, cache_dir() / "references")
    levers = {n: lv for i, (n, lv) in enumerate(LEVERS.items()) if i == 0 or not args.only or n in args.only}
    rows, engines = {}, {}
    for name, lv in levers.items():
        data = data_for(lv)
        torch.manual_seed(0)
        drafter = DFlashDrafter(drafter_config(model, tok, lv.layers, list(lv.taps), lv.block, smollm2.MASK_TOKEN_ID))
        if lv.target_init:
            drafter.init_from_target(model)
        cfg = TrainConfig(mode="drafter", steps=1, save_every=10 ** 9, save_dtype="float32", loss_vocab=lv.loss_vocab)
        sps = cpu_seconds_per_step(cfg, data, embed, head, drafter)
        steps = max(10, int(args.budget / sps))
        t, c = time.monotonic(), time.process_time()
        cfg = dataclasses.replace(cfg, steps=steps, log_every=max(1, steps // 10),
                                  out=str(cache_dir() / "levers" / re.sub(r"[^A-Za-z0-9]+", "-", name)))
        d = train(cfg, data, embed, head, drafter).drafter.eval()
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
    res = {"command": f"python bench/levers.py --budget {args.budget:g} --rows {args.rows} --tokens {args.tokens}",
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
