"""Argument types the subcommands share: argparse reports their ValueError as `argument --flag: invalid ...`."""

from __future__ import annotations

import argparse
import math


def seconds(text: str) -> float:
    """A finite number of seconds > 0 (a timeout: NaN or inf would never fire, 0 always)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}")
    return v
