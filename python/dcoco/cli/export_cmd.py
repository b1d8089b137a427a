"""`dcoco export`: a serving checkpoint rewritten in another dtype, or its drafter alone, or its drafter with a
trained DSpark head in the Qwen3 DSpark layout vLLM serves as `method: "dspark"`."""

from __future__ import annotations

import argparse

from .exits import exits


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a serving checkpoint directory: DFlash, DCOCO, or a drafter trained with a "
                                      "DSpark or Domino head (`dcoco train --method`), rewritten in its own layout")
    p.add_argument("out", help="destination folder")
    p.add_argument("--drafter-only", action="store_true",
                   help="write the plain DFlash checkpoint (the corrector dropped): the same drafter, corrector off")
    p.add_argument("--format", choices=("dflash", "dspark"), default="dflash",
                   help="dflash (default): the DFlash/DCOCO layout; dspark: the checkpoint's drafter with the "
                        "DSpark head given by --head, as a Qwen3 DSpark checkpoint (its corrector left out)")
    p.add_argument("--head", help="with --format dspark: a trained DSparkHead, as a safetensors file of its "
                                  "state_dict or a folder with model.safetensors (`dcoco demo`'s dspark stage)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="stored dtype (default: as saved)")


def run(args: argparse.Namespace) -> int:
    from ..modeling import checkpoint

    with exits("dcoco export"):
        dspark = args.format == "dspark"
        if dspark and args.head is None:
            raise ValueError("--head: --format dspark needs the DSpark head to write (a safetensors file or folder)")
        if not dspark and args.head is not None:
            raise ValueError("--head: only read with --format dspark")
        if dspark and args.drafter_only:
            raise ValueError("--drafter-only: a DSpark checkpoint never holds a corrector; leave it out with "
                             "--format dspark")
        print(checkpoint.export(args.checkpoint, args.out, drafter_only=args.drafter_only, dtype=args.dtype,
                                dspark_head=args.head))
    return 0
