"""`dcoco info`: how dcoco was built, and the backend each visible device gets."""

from __future__ import annotations

import argparse
import json


def arguments(p: argparse.ArgumentParser) -> None:
    """`dcoco info` takes no options."""


def run(args: argparse.Namespace) -> int:
    from .. import build_info

    print(json.dumps(build_info(), indent=2))
    return 0
