"""The `dcoco` command line."""

from __future__ import annotations

import argparse
import json
import sys


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dcoco", description="DCOCO: coherent parallel speculative drafts")
    sub = ap.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="the paper's experiment on the embedded SmolLM2-135M target, offline: train "
                                       "DFlash, DCOCO and a frozen-drafter corrector, then evaluate them")
    size = demo.add_mutually_exclusive_group()
    size.add_argument("--full", dest="size", action="store_const", const="full",
                      help="the recorded result: longer training, all 8 suites (about 75 min on 2 CPU cores)")
    size.add_argument("--smoke", dest="size", action="store_const", const="smoke",
                      help="a few steps of everything (about 2 min; what CI runs)")
    demo.set_defaults(size="default")
    demo.add_argument("--device", default="cpu", help="cpu or cuda (%(default)s)")
    demo.add_argument("--suites", help="folder of the evaluation suites (default: ../shared/data/eval)")
    demo.add_argument("--out", help="folder for the JSON and plots (default: the demo's cache folder)")
    demo.add_argument("--no-progress", action="store_true")
    sub.add_parser("info", help="how dcoco was built, and the backend each visible device gets and why")
    exp = sub.add_parser("export-smollm2", help="write the embedded SmolLM2-135M target as a transformers folder "
                                                "(what vLLM serves)")
    exp.add_argument("out", help="destination folder")
    _train_parser(sub.add_parser("train", help="train a DFlash drafter and/or the corrector (works under torchrun)"))
    _eval_parser(sub.add_parser("eval", help="tau, oracle tau, coverage and tokens/s over prompt suites, against "
                                             "target-only decoding in the same run"))
    _bench_parser(sub.add_parser("bench", help="the paper's serving benchmark (tokens/s and tau per suite) against "
                                               "an OpenAI-compatible server; `dcoco bench compare RUN...` joins runs"))
    return ap


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _train_parser(p: argparse.ArgumentParser) -> None:
    from .training import TrainConfig

    d = TrainConfig()
    g = p.add_argument_group("what to train")
    g.add_argument("--mode", choices=("drafter", "corrector", "joint"), default=d.mode,
                   help="drafter: DFlash loss; corrector: L_corr on a frozen drafter (needs --init); joint: both "
                        "(default: %(default)s)")
    g.add_argument("--out", default=d.out,
                   help="checkpoint directory: serving layout, train_state.pt, log.jsonl (default: %(default)s)")
    g.add_argument("--init", help="DFlash or DCOCO checkpoint to start from")
    g.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    g = p.add_argument_group("target and corpus")
    g.add_argument("--target", default="smollm2",
                   help="'smollm2' (embedded, the default) or a transformers causal LM path")
    g.add_argument("--prompts", help="JSONL of {\"prompt\": ...} lines (default: the set shipped with dcoco)")
    g.add_argument("--cache-dir", help="corpus cache (default: $DCOCO_CACHE/corpus or ~/.cache/dcoco/corpus)")
    g.add_argument("--max-prompt-tokens", type=int, default=300, help="longer prompts are dropped (%(default)s)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="response length cap (%(default)s)")
    g.add_argument("--gen-batch", type=int, default=16, help="generation batch (%(default)s)")
    g.add_argument("--feat-batch", type=int, default=8, help="feature-pass batch (%(default)s)")
    g = p.add_argument_group("new drafter (ignored with --init)")
    g.add_argument("--layers", type=int, default=2, help="drafter layers (%(default)s)")
    g.add_argument("--target-layers", type=_ints,
                   help="target taps, e.g. 1,15,27 (default: smollm2 1,15,27, else 3 evenly spaced)")
    g.add_argument("--block-size", type=int, default=16, help="anchor + drafted slots (%(default)s)")
    g.add_argument("--mask-token-id", type=int, help="default: the tokenizer's mask, else the first spare row "
                                                     "(smollm2: 16)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=d.epochs, help="(%(default)s)")
    g.add_argument("--steps", type=int, help="schedule length (default: epochs x steps per epoch)")
    g.add_argument("--stop-at", type=int, help="stop after this global step (resumable; schedule unchanged)")
    g.add_argument("--max-time", type=float, help="stop after this many seconds (resumable; schedule unchanged)")
    g.add_argument("--seqs-per-step", type=int, default=d.seqs_per_step,
                   help="sequences per step per rank (%(default)s)")
    g.add_argument("--anchors", type=int, help="anchors per sequence, at most (default: 512 on CUDA, 32 on a CPU)")
    g.add_argument("--lr", type=float, default=d.lr, help="AdamW, cosine schedule (%(default)s)")
    g.add_argument("--warmup", type=float, default=d.warmup, help="warmup fraction (%(default)s)")
    g.add_argument("--candidates", type=int, default=d.num_candidates, help="K (%(default)s)")
    g.add_argument("--width", type=int, default=d.width, help="corrector width r (%(default)s)")
    g.add_argument("--mlp-hidden", type=int, default=d.mlp_hidden, help="corrector MLP width (%(default)s)")
    g.add_argument("--seed", type=int, default=d.seed, help="(%(default)s)")
    g.add_argument("--save-every", type=int, default=d.save_every, help="steps between checkpoints (%(default)s)")
    g.add_argument("--log-every", type=int, default=d.log_every, help="steps per printed summary (%(default)s)")
    g.add_argument("--device", default=d.device, help="auto: cuda:LOCAL_RANK when available, else cpu")
    g.add_argument("--no-progress", action="store_true")


def _eval_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", required=True, help="DFlash or DCOCO serving checkpoint directory")
    p.add_argument("--target", default="smollm2",
                   help="'smollm2' (embedded, the default) or a transformers causal LM path")
    p.add_argument("--no-corrector", action="store_true", help="run the checkpoint's drafter without its corrector")
    p.add_argument("--rule", choices=("greedy", "global", "geometric"),
                   help="corrector path rule (default: the checkpoint's selection, else greedy)")
    p.add_argument("--lam", type=float, default=0.75, help="geometric weight (%(default)s)")
    p.add_argument("--candidates", type=int, help="K per slot (default: the checkpoint's, else 16)")
    p.add_argument("--suites", nargs="+", help="folders of *.jsonl suites or .jsonl files "
                                               "(default: ../shared/data/eval next to the repository)")
    p.add_argument("--hub", action="store_true", help="fetch suites from the Hugging Face hub (not supported yet)")
    p.add_argument("--rows", type=int, default=8, help="first rows per suite (%(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="(%(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (%(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="(%(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (%(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (%(default)s)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="dcoco-eval", help="folder for results.json and plots (%(default)s)")
    p.add_argument("--no-progress", action="store_true")


def _bench_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", help="the server's base URL, e.g. http://localhost:8000 (required)")
    p.add_argument("--model", help="the served model name (required)")
    p.add_argument("--out", help="run folder: requests.jsonl, batches.jsonl, run.json, table.md, PNGs (required); "
                                 "rerunning with the same --out resumes: requests done are kept, failed ones redone")
    p.add_argument("--suites", nargs="+", help="folders of *.jsonl suites or .jsonl files, every turn of each "
                                               "{\"turns\": [...]} line used (default: ../shared/data/eval)")
    p.add_argument("--only", help="comma-separated suite names (default: every suite found)")
    p.add_argument("--hub", action="store_true", help="fetch Alpaca and SPEED-Bench from the Hugging Face hub when "
                                                      "--suites lacks them (needs `datasets` and a network)")
    p.add_argument("--rows", help="rows per suite drawn with seed 1234, or 'all' (default: the paper's subsets: 128, "
                                  "all of AIME-25 and MT-Bench, 80 per SPEED-Bench category)")
    p.add_argument("--max-tokens", type=int, default=2048, help="new tokens per answer, at most (%(default)s)")
    p.add_argument("--seeds", default="greedy,42,43,44", help="'greedy' and sampling seeds (%(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="of the seeded runs (%(default)s)")
    p.add_argument("--concurrency", default="1", help="requests in flight, comma-separated to sweep, e.g. "
                                                      "1,4,8,16,32 (%(default)s)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each answer (%(default)s)")
    p.add_argument("--thinking", action="store_true", help="thinking on (chat_template_kwargs.enable_thinking)")
    p.add_argument("--no-progress", action="store_true")
    sub = p.add_subparsers(dest="bench_cmd", metavar="compare")
    c = sub.add_parser("compare", help="join runs into one table with speedups over the no-spec run, plus plots")
    c.add_argument("runs", nargs="+", metavar="RUN", help="run folders of `dcoco bench` or their run.json")
    c.add_argument("--out", required=True, help="folder for compare.md, compare.json and the PNGs")
    c.add_argument("--labels", help="comma-separated run names (default: each run's folder name)")
    c.add_argument("--baseline", help="the no-spec run's name (default: the run without spec-decode counters)")


def _bench(args: argparse.Namespace) -> int:
    from . import serve_bench, serve_bench_report as report

    try:
        if args.bench_cmd == "compare":
            j = report.compare(args.runs, args.labels.split(",") if args.labels else None, args.baseline)
            print(report.compare_table(j))
            print(f"wrote {', '.join(map(str, report.write_compare(j, args.out)))}")
            return 0
        missing = [f"--{k}" for k in ("endpoint", "model", "out") if getattr(args, k) is None]
        if missing:
            raise ValueError(f"the following arguments are required: {', '.join(missing)}")
        _, failed = serve_bench.run(
            args.endpoint, args.model, args.out, args.suites, args.only.split(",") if args.only else None, args.hub,
            serve_bench.parse_rows(args.rows), args.max_tokens, serve_bench.parse_seeds(args.seeds),
            args.temperature, serve_bench.parse_concurrency(args.concurrency), args.timeout, args.thinking,
            progress=not args.no_progress)
    except ValueError as e:
        raise SystemExit(f"dcoco bench: {e}") from None
    return 1 if failed else 0


def train_options(args: argparse.Namespace) -> tuple:
    """(TrainConfig, keyword arguments of recipe.run) from parsed `dcoco train` arguments."""
    from .training import TrainConfig

    cfg = TrainConfig(mode=args.mode, out=args.out, epochs=args.epochs, steps=args.steps, stop_at=args.stop_at,
                      max_time=args.max_time, seqs_per_step=args.seqs_per_step, anchors=args.anchors, lr=args.lr,
                      warmup=args.warmup, num_candidates=args.candidates, width=args.width,
                      mlp_hidden=args.mlp_hidden, seed=args.seed, save_every=args.save_every,
                      log_every=args.log_every, resume=args.resume, device=args.device)
    kw = dict(target=args.target, prompts=args.prompts, cache=args.cache_dir, init=args.init, layers=args.layers,
              target_layer_ids=args.target_layers, block_size=args.block_size, mask_token_id=args.mask_token_id,
              max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
              gen_batch=args.gen_batch, feat_batch=args.feat_batch, progress=not args.no_progress)
    return cfg, kw


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "info":
        from . import build_info
        print(json.dumps(build_info(), indent=2))
        return 0
    if args.cmd == "export-smollm2":
        from . import smollm2
        print(smollm2.export(args.out))
        return 0
    if args.cmd == "train":
        from . import recipe
        cfg, kw = train_options(args)
        recipe.run(cfg, **kw)
        return 0
    if args.cmd == "eval":
        from . import evaluate
        if args.hub:
            raise SystemExit("dcoco eval: --hub is not supported yet; download the suites (JSONL of "
                             "{\"turns\": [...]} lines) and pass them with --suites")
        try:
            res = evaluate.run(args.drafter, args.target, args.suites, args.rows, args.max_new_tokens,
                               args.temperature, args.top_p, args.top_k, corrector=not args.no_corrector,
                               rule=args.rule, lam=args.lam, num_candidates=args.candidates, seed=args.seed,
                               device=args.device, out=args.out, progress=not args.no_progress)
        except ValueError as e:
            raise SystemExit(f"dcoco eval: {e}") from None
        return 0 if res["lossless"] is not False else 1
    if args.cmd == "bench":
        return _bench(args)
    from . import demo as demo_mod
    try:
        res = demo_mod.run(args.size, args.device, args.out, args.suites, progress=not args.no_progress)
    except ValueError as e:
        raise SystemExit(f"dcoco demo: {e}") from None
    demo_mod.show(res)
    return 0 if res["eval"]["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
