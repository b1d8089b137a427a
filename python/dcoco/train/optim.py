"""The learning-rate schedule every trainer uses: linear warm-up, then cosine decay to zero."""

from __future__ import annotations

import math

import torch


def warmup_cosine(opt: torch.optim.Optimizer, warm: int, total: int, restart: int | None = None,
                  start: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """opt's LR x (s + 1) / warm for the first warm steps, then x half a cosine from 1 to 0 at step total. restart:
    the step a run resumed from its weights alone, with a fresh optimizer: from there the LR warms up again over
    warm steps towards the same cosine. start: the step the schedule begins at (opt's LR is the base LR). A plain
    function, not a callable object: LambdaLR would then put it in the scheduler's saved state."""
    def factor(s: int) -> float:
        f = (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm)))
        return f * min(1.0, (s - restart + 1) / warm) if restart is not None and warm and s >= restart else f

    if start:
        for group in opt.param_groups:  # what LambdaLR reads as the base LR when it does not start at 0
            group.setdefault("initial_lr", group["lr"])
    return torch.optim.lr_scheduler.LambdaLR(opt, factor, last_epoch=start - 1)
