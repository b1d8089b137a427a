"""The joint step's cost with the DFlash loss over the whole LM head against over a shortlist (`--loss-vocab`),
on the scale recipe's joint stage: SmolLM2-135M, a scale drafter, a fresh corrector, 2 sequences x 128 anchors of
the committed corpus. The two objectives' forward and backward are timed alternately on the same batches (the
target's feature pass, the same either way, is timed apart), and the ratio of the medians is reported.

    .venv/bin/python bench/joint_step.py --drafter checkpoints/smollm2-scale/drafter-4 --out bench/results/joint-step"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from dcoco.corrector import Corrector
from dcoco.modeling import checkpoint
from dcoco.target.features import TargetFeatures, TokenCorpus
from dcoco.target import smollm2
from dcoco.target.load import SMOLLM2, load_target
from dcoco.train import datagen
from dcoco.train.batches import Schedule, frequent_tokens
from dcoco.train.config import TrainConfig
from dcoco.train.objective import Objective

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True, help="a DFlash checkpoint for SmolLM2-135M")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the batches, the order flipped each pass")
    ap.add_argument("--loss-vocab", type=int, default=4096)
    ap.add_argument("--out", default="bench/results/joint-step")
    a = ap.parse_args()
    tok, model = load_target(SMOLLM2)
    embed, head = (m.weight.detach() for m in (model.get_input_embeddings(), model.get_output_embeddings()))
    data = TokenCorpus(datagen.load(smollm2.corpus_dir(), embed.shape[0]))
    drafter = checkpoint.load(a.drafter)[0].float()
    feats = TargetFeatures(model, drafter.config.target_layer_ids, torch.device("cpu"), labels="corpus")
    sched = Schedule(data, 0, 2, 128, 0, 1)
    target_s, batches = [], []
    for i in range(a.batches):
        b = sched.batch(i)
        t = time.perf_counter()
        batches.append({**b, **feats(b["ids"])})
        target_s.append(time.perf_counter() - t)
    corrector = Corrector(drafter.config.hidden_size, 16, 128, 256)
    objectives = {"whole head": Objective(drafter, corrector, TrainConfig(mode="joint")),
                  f"shortlist {a.loss_vocab}": Objective(drafter, corrector,
                                                        TrainConfig(mode="joint", loss_vocab=a.loss_vocab),
                                                        frequent_tokens(data, a.loss_vocab))}
    seconds: dict[str, list[float]] = {k: [] for k in objectives}
    for r in range(a.rounds):
        order = list(objectives.items())
        for b in batches:
            for name, obj in (order if r % 2 == 0 else order[::-1]):
                t = time.perf_counter()
                obj(b, embed, head)["loss"].backward()
                seconds[name].append(time.perf_counter() - t)
                drafter.zero_grad(set_to_none=True)
                corrector.zero_grad(set_to_none=True)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    whole, short = med.values()
    res = {"command": " ".join(["python", *sys.argv]), "torch_threads": torch.get_num_threads(),
           "blocks_per_step": int(batches[0]["anchor_ok"].sum()), "target_pass_seconds": target_s,
           "objective_seconds": seconds, "median_seconds": med, "whole_over_shortlist": whole / short}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "joint-step.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("median_seconds", "whole_over_shortlist", "target_pass_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
