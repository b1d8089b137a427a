"""`dcoco export-smollm2`: the embedded SmolLM2-135M target written as a transformers folder (what vLLM serves)."""

from __future__ import annotations

import argparse


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="destination folder")


def run(args: argparse.Namespace) -> int:
    from ..target import smollm2

    print(smollm2.export(args.out))
    return 0
