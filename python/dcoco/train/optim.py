"""The learning-rate schedule every trainer uses: linear warm-up, then cosine decay to zero."""

from __future__ import annotations

import math

import torch


def warmup_cosine(opt: torch.optim.Optimizer, warm: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """opt's LR x (s + 1) / warm for the first warm steps, then x half a cosine from 1 to 0 at step total. A plain
    function, not a callable object: LambdaLR would then put it in the scheduler's saved state."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else
                                             0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))))
