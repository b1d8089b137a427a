"""The `dcoco` command line."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="dcoco", description="DCOCO: coherent parallel speculative drafts")
    sub = ap.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="the corrector on the embedded SmolLM2-135M target (offline)")
    demo.add_argument("--prompt", default="Write a short poem about the sea.")
    demo.add_argument("--device", default="cpu")
    demo.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    sub.add_parser("info", help="how dcoco was built and which devices it sees")
    args = ap.parse_args(argv)

    if args.cmd == "info":
        from . import build_info
        print(json.dumps(build_info(), indent=2))
        return 0
    from . import demo as demo_mod
    res = demo_mod.run(args.prompt, args.device)
    demo_mod.show(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
