"""The online target pass that `dcoco train --features online` runs on every batch, with the two label sources side
by side in one run, on the committed SmolLM2 corpus (the target's own greedy answers):

- argmax: the whole target, labels = its argmax over the LM head;
- corpus: labels = the corpus tokens, the pass stopped after the last tap (`--labels corpus`).

It times both on the same batches (2 sequences, as a training step has; the order alternates per round), and checks
what `--labels corpus` rests on: its taps equal the full pass's bit for bit, and the argmax equals the corpus token
at every response position.

    .venv/bin/python bench/online_features.py --out bench/results/online-features/online-features.json"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from dcoco.target import smollm2
from dcoco.target.load import SMOLLM2, load_target
from dcoco.train import shards
from dcoco.train.batches import collate
from dcoco.target.features import TargetFeatures, TokenCorpus
from dcoco.train.recipe import SMOLLM2_TAPS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="bench/results/online-features/online-features.json")
    args = ap.parse_args()
    pairs = shards.load(str(smollm2.corpus_dir()))
    random.Random(0).shuffle(pairs)
    corpus = TokenCorpus(pairs[:args.sequences])
    batches = [collate([corpus[i], corpus[i + 1]], [torch.tensor([0])] * 2) for i in range(0, len(corpus) - 1, 2)]
    _, model = load_target(SMOLLM2, None)
    dev = torch.device("cpu")
    passes = {labels: TargetFeatures(model, SMOLLM2_TAPS, dev, labels=labels) for labels in ("argmax", "corpus")}
    seconds = {k: [] for k in passes}
    agree = total = 0
    same_taps = True
    for r in range(args.rounds):
        for name in (list(passes) if r % 2 == 0 else list(passes)[::-1]):
            t = time.perf_counter()
            for b in batches:
                passes[name](b["ids"])
            seconds[name].append(time.perf_counter() - t)
    for b in batches:
        full, short = passes["argmax"](b["ids"]), passes["corpus"](b["ids"])
        same_taps &= torch.equal(full["hidden"], short["hidden"])
        resp = b["response"]
        agree += int((full["labels"][resp] == b["ids"][resp]).sum())
        total += int(resp.sum())
    tokens = sum(len(corpus[i]["ids"]) for i in range(2 * len(batches)))
    tps = {k: tokens / min(v) for k, v in seconds.items()}
    res = {"command": "python bench/online_features.py " + " ".join(
               f"--{k} {v}" for k, v in vars(args).items()),
           "target": "SmolLM2-135M-Instruct, float32", "threads": torch.get_num_threads(),
           "taps": SMOLLM2_TAPS, "batches": len(batches), "tokens": tokens, "seconds": seconds,
           "tokens_per_second": tps, "speedup_corpus_over_argmax": tps["corpus"] / tps["argmax"],
           "response_positions": total, "argmax_equals_corpus": agree, "taps_bitwise_equal": bool(same_taps)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("tokens_per_second", "speedup_corpus_over_argmax", "response_positions",
                                          "argmax_equals_corpus", "taps_bitwise_equal")}, indent=1))


if __name__ == "__main__":
    main()
