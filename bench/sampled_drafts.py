"""Sampled decoding (temperature 1): does drafting by sampling the corrector's walk, with its sparse proposal q,
accept more than today's point-mass proposal (the corrector's greedy walk, q = 1 at each draft)?

Offline speculative decoding (dcoco.specdec.engine) on the embedded SmolLM2-135M target and the DCOCO drafter shipped in
tests/data (a default-size demo drafter; or --drafter DIR), over the shipped suites' prompts, each decoded with
--seeds seeds. Four engines on the same drafter: DFlash (the corrector off) and DCOCO, each drafting greedily
(point mass) and probabilistically (the engine's draft_sample_method). tau with 95% CIs and ratios against DCOCO's
point mass with paired bootstrap CIs over the (prompt, seed) decodes.

    # about 20 min on 2 cores
    .venv/bin/python bench/sampled_drafts.py --out bench/results/sampled-drafts/sampled-drafts.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dcoco.modeling import checkpoint
from dcoco.specdec import stats
from dcoco.specdec.evaluate import decode_all, encode
from dcoco.suites import load_suites
from dcoco.target.load import SMOLLM2, load_target
from dcoco.specdec.engine import Engine, summarize

SHIPPED = Path(__file__).parents[1] / "tests" / "data" / "smollm2-dcoco"
BASE = "DCOCO, point mass"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default=str(SHIPPED), help="a DCOCO drafter checkpoint (corrector included)")
    ap.add_argument("--rows", type=int, default=4, help="prompts per suite (8 suites)")
    ap.add_argument("--seeds", type=int, default=2, help="decodes per prompt, each its own sample")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out", default="bench/results/sampled-drafts/sampled-drafts.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    tok, model = load_target(SMOLLM2)
    drafter, corrector = checkpoint.load(args.drafter)
    if corrector is None:
        raise SystemExit(f"--drafter: {args.drafter} has no corrector")
    drafter, corrector = drafter.float().eval(), corrector.float().eval()
    engines = {f"{name}, {kind}": Engine(model, drafter, c, draft_sample_method=method)
               for name, c in (("DFlash", None), ("DCOCO", corrector))
               for kind, method in (("point mass", "greedy"), ("sampled", "probabilistic"))}
    prompts = encode(tok, load_suites(rows=args.rows))
    per_method: dict[str, list] = {m: [] for m in ("target-only", *engines)}
    for seed in range(args.seeds):  # the seeds apart: seed s decodes prompt i with generator seed 1000 s + i
        out, _ = decode_all(model, engines, prompts, args.tokens, temperature=args.temperature, seed=1000 * seed,
                            warm_up=seed == 0)
        for m, suites in out.items():
            per_method[m] += [r for rs in suites.values() for r in rs]
    spec = {m: v for m, v in per_method.items() if m != "target-only"}
    table = stats.tau_table(spec, BASE)
    rates = {m: summarize(v)["accept_rate"] for m, v in spec.items()}
    res = {"command": "python bench/sampled_drafts.py " + " ".join(
               f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
           "drafter": str(args.drafter), "temperature": args.temperature, "tokens": args.tokens,
           "decodes": len(per_method[BASE]), "base": BASE, "tau": table, "accept_rate": rates}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"T = {args.temperature}, {res['decodes']} decodes of {args.tokens} tokens, ratios against {BASE}:")
    for m, row in table.items():
        ci = row["ratio_ci"]
        print(f"  {m:20s} tau {row['tau']:.3f} [{row['tau_ci'][0]:.3f}, {row['tau_ci'][1]:.3f}]  ratio "
              f"{row['ratio']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
