"""The `dcoco` command line: one module per subcommand, each with arguments(parser) and run(args)."""

from __future__ import annotations

import argparse
import os
import sys

from . import bench_cmd, data_cmd, demo_cmd, eval_cmd, export_cmd, export_smollm2_cmd, info_cmd, train_cmd

COMMANDS = {  # name: (module, help), in the order `dcoco --help` lists them
    "demo": (demo_cmd, "the paper's experiment on the embedded SmolLM2-135M target, offline: train DFlash, DCOCO "
                       "and a frozen-drafter corrector, then evaluate them"),
    "info": (info_cmd, "how dcoco was built, and the backend each visible device gets and why"),
    "export-smollm2": (export_smollm2_cmd, "write the embedded SmolLM2-135M target as a transformers folder (what "
                                           "vLLM serves)"),
    "data": (data_cmd, "training data through a serving engine: `prompts` written by the target itself, the "
                       "target's answers (`generate`), packed into shards (`pack`)"),
    "export": (export_cmd, "rewrite a serving checkpoint: another dtype, the drafter alone, or the drafter with a "
                           "DSpark head (vLLM's qwen3_dspark layout)"),
    "train": (train_cmd, "train a DFlash drafter and/or the corrector (works under torchrun)"),
    "eval": (eval_cmd, "tau, oracle tau, coverage and tokens/s over prompt suites, against target-only decoding in "
                       "the same run"),
    "bench": (bench_cmd, "the paper's serving benchmark (tokens/s and tau per suite) against an OpenAI-compatible "
                         "server; `dcoco bench compare RUN...` joins runs"),
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dcoco", description="DCOCO: coherent parallel speculative drafts")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, (cmd, text) in COMMANDS.items():
        cmd.arguments(sub.add_parser(name, help=text))
    return ap


def main(argv=None) -> int:
    """`dcoco ...`: a library error (bad input found after argument parsing, an unreadable file) ends the command
    with one `dcoco <command>: ...` line and exit code 1; DCOCO_DEBUG=1 shows the whole traceback instead."""
    args = parser().parse_args(argv)
    try:
        if args.cmd == "train":  # it rereads the command line: a --config recipe's keys yield to the options given
            return train_cmd.run(argv if argv is not None else sys.argv[1:], args)
        return COMMANDS[args.cmd][0].run(args)
    except (ValueError, OSError) as e:
        if os.environ.get("DCOCO_DEBUG", "") not in ("", "0"):
            raise
        raise SystemExit(f"dcoco {args.cmd}: {type(e).__name__ + ': ' if isinstance(e, OSError) else ''}{e}") from None
