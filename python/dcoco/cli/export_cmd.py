"""`dcoco export`: a serving checkpoint rewritten in another dtype, or its drafter alone."""

from __future__ import annotations

import argparse

from .exits import exits


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a DFlash or DCOCO serving checkpoint directory")
    p.add_argument("out", help="destination folder")
    p.add_argument("--drafter-only", action="store_true",
                   help="write the plain DFlash checkpoint (the corrector dropped): the same drafter, corrector off")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="stored dtype (default: as saved)")


def run(args: argparse.Namespace) -> int:
    from ..modeling import checkpoint

    with exits("dcoco export"):
        print(checkpoint.export(args.checkpoint, args.out, drafter_only=args.drafter_only, dtype=args.dtype))
    return 0
