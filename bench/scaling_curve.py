"""The scaling curve: DFlash's tau and each frozen-drafter corrector's gain over it, against the response tokens the
drafter was trained on. Each point is a given DFlash drafter for SmolLM2-135M-Instruct; on it, as `dcoco demo
--drafter` does (and sharing its cached stages), DCOCO's corrector and the anchor-aware one are trained on the
frozen drafter's cached outputs over the demo corpus, and all are evaluated by exact greedy simulation on the
demo's evaluation prompts, with paired 95% bootstrap CIs over prompts. Run in .venv:

    .venv/bin/python bench/scaling_curve.py --size full \\
        --point drafter-1=checkpoints/smollm2-scale/drafter-1@TOKENS ... --out bench/results/scaling-curve

TOKENS: the response tokens the drafter's training read (the stages' sequences times their mean response
length, as the study's note derives them). --recorded NAME=JSON@TOKENS adds a point from a `dcoco demo` JSON of the
same size (its DFlash, frozen and anchor-aware rows) without recomputing it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from dcoco import plots
from dcoco.experiments import demo
from dcoco.specdec import simulate
from dcoco.specdec.engine import Engine
from dcoco.specdec.evaluate import encode
from dcoco.target.load import SMOLLM2, load_target
from dcoco.train.recipe import cache_dir

METHODS = {"corrector": demo.FROZEN, "anchor": demo.ANCHOR}  # stage -> the demo's method name


def _named(spec: str, flag: str) -> tuple[str, Path, int]:
    name, sep, rest = spec.partition("=")
    where, at, tokens = rest.rpartition("@")
    if not (sep and at and name and tokens.isdigit()):
        raise SystemExit(f"{flag}: expected NAME=PATH@TOKENS, got {spec!r}")
    return name, Path(where), int(tokens)


def measure(size: str, drafter: Path, device: str, progress: bool) -> dict:
    """One point: {method: the simulated evaluation's overall row} for DFlash and each corrector of METHODS."""
    s = demo.SIZES[size]
    tok, model = load_target(SMOLLM2)
    given = demo.given_drafter(drafter, model)
    work = demo.workdir(size, given)
    model.to(device)
    data = demo.build_corpus(model, s, progress, tuple(given[0].config.target_layer_ids))
    embed, head = (m.weight.detach() for m in (model.get_input_embeddings(), model.get_output_embeddings()))
    makes, caches = demo.frozen_models(given[0], embed), {}
    trained = {stage: demo.frozen_stage(work / stage, makes[stage], s.corrector_steps, given, data, embed, head,
                                        device, caches, progress, anchors=s.frozen_anchors, batch=s.frozen_batch)
               for stage in METHODS}
    d = given[0].to(device).eval()
    engines = {"DFlash": Engine(model, d)} | {name: Engine(model, d, trained[stage][1].to(device).eval())
                                               for stage, name in METHODS.items()}
    prompts = encode(tok, demo.eval_texts(s.suites, s.sim_rows))
    refs = simulate.references(model, prompts, s.sim_tokens, engines["DFlash"].eos, cache_dir() / "references",
                               progress)
    per = simulate.simulate_all(engines, prompts, refs, s.sim_tokens, progress)
    return {m: row["overall"] for m, row in simulate.report(per, "DFlash").items()}


def recorded(path: Path) -> dict:
    """A demo JSON's DFlash, frozen and anchor-aware rows, in measure's layout."""
    m = json.loads(path.read_text())["sim"]["methods"]
    return {name: m[name]["overall"] for name in ("DFlash", *METHODS.values())}


def row(name: str, tokens: int, source: str, rows: dict) -> dict:
    keep = ("tau", "tau_ci", "ratio", "ratio_ci", "prompts", "rounds")
    return {"point": name, "response_tokens": tokens, "source": source,
            "methods": {m: {k: r.get(k) for k in keep} for m, r in rows.items()}}


def plot(points: list[dict], path: Path) -> None:
    plt = plots.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    pts = sorted(points, key=lambda p: p["response_tokens"])
    x = [p["response_tokens"] for p in pts]
    for ax, key, methods, label in ((left, "tau", ["DFlash"], "τ (simulated greedy)"),
                                    (right, "ratio", list(METHODS.values()), "τ over DFlash's")):
        for i, m in enumerate(methods):
            ys = [p["methods"][m][key] for p in pts]
            lo = [y - p["methods"][m][f"{key}_ci"][0] for y, p in zip(ys, pts)]
            hi = [p["methods"][m][f"{key}_ci"][1] - y for y, p in zip(ys, pts)]
            ax.errorbar(x, ys, yerr=[lo, hi], marker="o", capsize=3, color=f"C{i}", label=m)
        for xi, p in zip(x, pts):
            ax.annotate(p["point"], (xi, p["methods"][methods[0]][key]), fontsize=7, textcoords="offset points",
                        xytext=(4, -10))
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())  # log minor labels collide across a decade or two
        ax.set_xlabel("response tokens trained on")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    right.axhline(1.0, color="gray", lw=0.8)
    plots.save(fig, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=sorted(demo.SIZES))
    ap.add_argument("--point", action="append", default=[], metavar="NAME=DRAFTER@TOKENS")
    ap.add_argument("--recorded", action="append", default=[], metavar="NAME=JSON@TOKENS")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--out", default="bench/results/scaling-curve")
    a = ap.parse_args()
    points = [(*_named(p, "--point"), False) for p in a.point] + [(*_named(p, "--recorded"), True)
                                                                   for p in a.recorded]
    if not points:
        raise SystemExit("give at least one --point or --recorded")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, rows = time.monotonic(), []
    for name, path, tokens, is_json in points:
        rows.append(row(name, tokens, str(path), recorded(path) if is_json else
                        measure(a.size, path, a.device, not a.no_progress)))
        print(json.dumps(rows[-1]), flush=True)
    res = {"config": {"size": a.size, "command": " ".join(sys.argv), "torch_threads": torch.get_num_threads()},
           "points": rows, "seconds": time.monotonic() - t0}
    name = "scaling-curve" if a.size == "small" else f"scaling-curve-{a.size}"
    (out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(rows, out / f"{name}.png")
    for r in sorted(rows, key=lambda r: r["response_tokens"]):
        cells = [f"{m} {v['tau']:.3f} (x{v['ratio']:.3f} [{v['ratio_ci'][0]:.3f}, {v['ratio_ci'][1]:.3f}])"
                 if v.get("ratio_ci") else f"{m} {v['tau']:.3f} [{v['tau_ci'][0]:.3f}, {v['tau_ci'][1]:.3f}]"
                 for m, v in r["methods"].items()]
        print(f"{r['point']:>12} {r['response_tokens']:>9}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
