"""The one matplotlib set-up of dcoco's figures (demo, eval, bench): files only, no display."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported on first use: matplotlib is slow to import)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: str | Path) -> None:
    """Lay out, write (120 dpi) and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
