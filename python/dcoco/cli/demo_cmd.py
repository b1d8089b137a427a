"""`dcoco demo`: its options, and the run (experiments/demo.py) turned into a table and an exit code."""

from __future__ import annotations

import argparse

from .exits import exits


def arguments(p: argparse.ArgumentParser) -> None:
    size = p.add_mutually_exclusive_group()
    size.add_argument("--full", dest="size", action="store_const", const="full",
                      help="the recorded result: longer training, all 8 suites "
                           "(its run time and results: docs/demo.md)")
    size.add_argument("--smoke", dest="size", action="store_const", const="smoke",
                      help="a few steps of everything (what CI runs)")
    p.set_defaults(size="default")
    p.add_argument("--device", default="cpu", help="cpu or cuda (%(default)s)")
    p.add_argument("--suites", help="folder of the evaluation suites (default: the 8 shipped in dcoco/data/suites)")
    p.add_argument("--drafter", help="a DFlash checkpoint for SmolLM2-135M-Instruct (e.g. checkpoints/smollm2-scale/"
                                     "drafter-4) to build on and compare with instead of training the demo's own; "
                                     "its stages are cached apart")
    p.add_argument("--out", help="folder for the JSON and plots (default: the demo's cache folder)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..experiments import demo

    with exits("dcoco demo"):
        res = demo.run(args.size, args.device, args.out, args.suites, progress=not args.no_progress,
                       drafter=args.drafter)
    demo.show(res)
    return 0 if res["eval"]["lossless"] else 1
