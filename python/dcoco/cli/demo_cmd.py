"""`dcoco demo`: its options, and the run (experiments/shipped.py for the shipped drafters, experiments/demo.py for
the rebuilt sizes) turned into a table and an exit code."""

from __future__ import annotations

import argparse

from .exits import exits


def arguments(p: argparse.ArgumentParser) -> None:
    size = p.add_mutually_exclusive_group()
    size.add_argument("--small", dest="size", action="store_const", const="small",
                      help="rebuild everything here instead: a drafter, the correctors and the baselines trained on "
                           "400 demo sequences, then evaluated (about an hour on 2 CPU cores)")
    size.add_argument("--full", dest="size", action="store_const", const="full",
                      help="rebuild at the recorded size: longer training, all 8 suites "
                           "(its run time and results: docs/demo.md)")
    size.add_argument("--smoke", dest="size", action="store_const", const="smoke",
                      help="rebuild with a few steps of everything (what CI runs)")
    p.set_defaults(size="shipped")
    p.add_argument("--release", help="the shipped drafters' folder, with its release.toml (default: "
                                     "checkpoints/smollm2-scale of a dcoco checkout, from its root)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (%(default)s)")
    p.add_argument("--suites", help="folder of the evaluation suites (default: the 8 shipped in dcoco/data/suites)")
    p.add_argument("--drafter", help="with --small, --full or --smoke: a DFlash checkpoint for SmolLM2-135M-Instruct "
                                     "(e.g. checkpoints/smollm2-scale/drafter-4) to build on and compare with "
                                     "instead of training the demo's own; its stages are cached apart")
    p.add_argument("--out", help="folder for the JSON and plots (default: the demo's cache folder)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..experiments import demo, shipped

    with exits("dcoco demo"):
        if args.size == "shipped":
            if args.drafter is not None:
                raise ValueError("--drafter: builds a rebuilt demo on a drafter; add --small, --full or --smoke "
                                 "(plain `dcoco demo` evaluates the shipped drafters of --release)")
            res = shipped.run(args.device, args.out, args.suites, progress=not args.no_progress,
                              release_dir=args.release or shipped.RELEASE)
        else:
            if args.release is not None:
                raise ValueError("--release: the shipped drafters are what plain `dcoco demo` evaluates; "
                                 f"--{args.size} rebuilds its own")
            res = demo.run(args.size, args.device, args.out, args.suites, progress=not args.no_progress,
                           drafter=args.drafter)
    (shipped if args.size == "shipped" else demo).show(res)
    return 0 if res["eval"]["lossless"] else 1
