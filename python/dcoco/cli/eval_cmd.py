"""`dcoco eval`: offline speculative decoding over prompt suites against target-only decoding."""

from __future__ import annotations

import argparse

from .exits import exits


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", required=True, help="DFlash or DCOCO serving checkpoint directory")
    p.add_argument("--target", default="smollm2",
                   help="'smollm2' (embedded, the default) or a transformers causal LM path")
    p.add_argument("--no-corrector", action="store_true", help="run the checkpoint's drafter without its corrector")
    p.add_argument("--rule", choices=("greedy", "global", "geometric"),
                   help="corrector path rule (default: the checkpoint's selection, else greedy)")
    p.add_argument("--lam", type=float, default=0.75, help="geometric weight (%(default)s)")
    p.add_argument("--candidates", type=int, help="K per slot (default: the checkpoint's, else 16)")
    p.add_argument("--suites", nargs="+", help="folders of *.jsonl suites or .jsonl files "
                                               "(default: the 8 suites shipped in dcoco/data/suites)")
    p.add_argument("--hub", action="store_true", help="fetch suites from the Hugging Face hub (not supported yet)")
    p.add_argument("--rows", default="8", help="rows per suite, drawn as `dcoco bench --rows N` draws them (the "
                                               "same rows), 'all', or 'paper' (the paper's subsets); every turn "
                                               "of each row is decoded (%(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="(%(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (%(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="(%(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (%(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (%(default)s)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--thinking", action="store_true", help="thinking on in the chat template (enable_thinking)")
    p.add_argument("--out", default="dcoco-eval", help="folder for results.json and plots (%(default)s)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..specdec import evaluate
    from ..suites import parse_rows

    if args.hub:
        raise SystemExit("dcoco eval: --hub is not supported yet; download the suites (JSONL of "
                         "{\"turns\": [...]} lines) and pass them with --suites")
    with exits("dcoco eval"):
        rows = parse_rows(None if args.rows == "paper" else args.rows)
        cfg = evaluate.EvalConfig(
            drafter=args.drafter, target=args.target, suites=args.suites, rows=rows,
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            corrector=not args.no_corrector, rule=args.rule, lam=args.lam, num_candidates=args.candidates,
            seed=args.seed, device=args.device, out=args.out, thinking=args.thinking)
        res = evaluate.run(cfg, progress=not args.no_progress)
    return 0 if res["lossless"] is not False else 1
