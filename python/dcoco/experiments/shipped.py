"""`dcoco demo`, the main job: the shipped drafters (release.py) evaluated on the paper's suites as the rebuilt
demo evaluates its own (demo.evaluate: tau simulated exactly with paired CIs, real decoding for tokens/s and the
losslessness check), beside a corrector trained here on the shipped drafter's frozen outputs over part of the
committed corpus (demo.frozen_stage), the pipeline end to end. Offline, CPU or GPU; the corpus features, the
drafter's cached outputs, the trained corrector and the target's reference continuations are cached under
$DCOCO_CACHE, so a second run only evaluates."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from ..corrector import Corrector
from ..modeling import checkpoint
from ..specdec.evaluate import encode
from ..target import corpus, smollm2
from ..target.load import SMOLLM2, load_target
from ..train import datagen
from ..train.recipe import cache_dir, subset_of
from . import demo, release, report
from .report import ANCHOR, BUDGET_CONTROL, FROZEN, JOINT_OFF, ONLINE

RELEASE = Path("checkpoints") / "smollm2-scale"  # in a dcoco checkout, where the README's commands run
HERE = "DCOCO, frozen drafter, trained here"
# the corrector trained here: `sequences` of the committed corpus (nested subsets: recipe.subset_of), their
# frozen_anchors blocks each, corrector_steps steps of frozen_batch blocks (the small demo's frozen stage); the
# evaluation: the small demo's suites and prompts
SIZE = dataclasses.replace(demo.SIZES["small"], sequences=128, steps=0, long_steps=0, joint_steps=0, rows=1)
MAX_RESPONSE_TOKENS = 256  # the committed corpus's answers are at most this long


def models(rel: release.Release, target) -> dict[str, tuple]:
    """{role: (drafter, corrector or None, info)} of the release's trained stages; info names the stage and its
    progress. ValueError when a frozen-drafter corrector was trained on another drafter than the release's."""
    base = demo.given_drafter(rel.stages["drafter"].path, target)
    out = {"drafter": base}
    for role, st in rel.stages.items():
        info = {"path": str(st.path), "step": st.step, "total": st.total, "heldout_tau": st.tau}
        if role == "drafter":
            base[2].update(info)
        elif role != "parent":
            d, c = checkpoint.load(st.path)
            if role in ("corrector", "anchor") and not torch.equal(d.fc.weight.float(), base[0].fc.weight):
                raise ValueError(f"release: {role} {st.path} was trained on another drafter than "
                                 f"{rel.stages['drafter'].path}")
            out[role] = (d.float(), None if c is None else c.float(), info)
    return out


def corpus_sample(model, taps: tuple[int, ...], sequences: int, progress: bool) -> corpus.Corpus:
    """The first `sequences` of the committed corpus (subset_of's fixed permutation) with this machine's target
    features at taps, cached."""
    samples = datagen.load(smollm2.corpus_dir(), model.get_input_embeddings().weight.shape[0])
    chosen = subset_of(samples, sequences, "the committed corpus")
    settings = corpus.CorpusSettings(taps, max_new_tokens=MAX_RESPONSE_TOKENS)
    return corpus.build_corpus(model, [p for p, _ in chosen], cache_dir() / "corpus", settings, progress=progress,
                               responses=[r for _, r in chosen])


def methods(trained: dict, here: tuple, rules: tuple[str, ...]) -> dict[str, tuple]:
    """{method: (drafter, corrector or None, rule)}, DFlash first, for the roles the release has."""
    d0 = trained["drafter"][0]
    out: dict[str, tuple] = {"DFlash": (d0, None, "greedy")}
    for role, name in (("corrector", FROZEN), ("anchor", ANCHOR)):
        if role in trained:
            out[name] = (d0, trained[role][1], "greedy")
    out[HERE] = (d0, here[1], "greedy")
    if "joint" in trained:
        d1, c1, _ = trained["joint"]
        out.update({f"DCOCO joint {r}": (d1, c1, r) for r in rules})
        out[JOINT_OFF] = (d1, None, "greedy")
    if "control" in trained:
        d2, c2, _ = trained["control"]
        out[ONLINE] = (d2, c2, "greedy")
        out[BUDGET_CONTROL] = (d2, None, "greedy")
    return out


def joint_settings(rel: release.Release) -> dict | None:
    """The joint stage's corr_grad, lr and steps, None without one."""
    st = rel.stages.get("joint")
    if st is None:
        return None
    return {"corr_grad": st.config["corr_grad"], "lr": st.config["lr"], "steps": st.step}


def run(device: str = "cpu", out: str | Path | None = None, suites_dir=None, progress: bool = True,
        release_dir: str | Path = RELEASE) -> dict:
    """Everything `dcoco demo` does; writes {out}/demo-smollm2-shipped.json and plots (out: the work folder)."""
    s, t0 = SIZE, time.monotonic()
    rel = release.load(release_dir)
    texts = demo.eval_texts(s.suites, s.sim_rows, suites_dir)  # a missing folder fails before the slow stages
    tok, model = load_target(SMOLLM2)
    trained = models(rel, model)
    base = trained["drafter"]
    work = cache_dir() / "demo-shipped" / f"drafter-{base[2]['recipe']['drafter'][:12]}"
    prompts = encode(tok, texts)
    model.to(device)
    taps = tuple(base[0].config.target_layer_ids)
    assert s.sequences is not None, "the corrector trained here takes part of the corpus"
    data = corpus_sample(model, taps, s.sequences, progress)
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    here = demo.frozen_stage(work / "corrector", lambda: Corrector(base[0].config.hidden_size), s.corrector_steps,
                             base, data, embed, head, device, {}, progress, anchors=s.frozen_anchors,
                             batch=s.frozen_batch)
    sim, ev, engines = demo.evaluate(model, methods(trained, here, s.rules), prompts, s, device, progress)
    dcfg = base[0].config
    res: dict[str, Any] = {
        "size": "shipped",
        "config": {**dataclasses.asdict(s), "layers": dcfg.num_hidden_layers, "block_size": dcfg.block_size,
                   "target_layers": list(taps), "device": device, "release": str(rel.root),
                   "corpus_sequences": len(data), "corpus_response_tokens": int(data.response.sum())},
        "release": {"stages": {role: v[2] for role, v in trained.items()},
                    "missing": {role: str(p) for role, p in rel.missing.items()}},
        "training": {"corrector (trained here)": here[2]}, "sim": sim, "eval": ev,
        "costs": demo.costs(engines, s.cost_repeats)}
    res["headline"] = report.headline(ev, sim, s.rules, demo.HEADLINE, joint_settings(rel),
                                      {"corpus_tokens": release.corpus_tokens(), "converged": release.converged(rel)})
    res["co_adaptation"] = report.co_adaptation(sim, s.rules, {})
    res["seconds"] = time.monotonic() - t0
    return demo.write(res, Path(out) if out else work, "demo-smollm2-shipped", work)


def show(res: dict) -> None:
    print(report.table(res))
    missing = res["release"]["missing"]
    if missing:
        print("not in the release yet: " + ", ".join(f"{role} ({path})" for role, path in missing.items()))
    print(f"the corrector trained here: {res['work'] / 'corrector'}; wrote {', '.join(res['files'])}")
