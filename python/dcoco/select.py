"""Path selection on a score grid: prefix-first greedy (what DCOCO serves), Global-Sum, Geometric."""

from __future__ import annotations

import torch

from . import _ops, backend, native


def select(scores: torch.Tensor, first_logits: torch.Tensor, rule: str = "greedy", lam: float = 0.75) -> torch.Tensor:
    """Ranks (R,B) int64 of the chosen path through scores (R,B-1,K,K), S_{p+1}(a,b) = scores[:,p,a,b].

    greedy:    k_1 = argmax first_logits, then k_{p+1} = argmax_b S_p(k_p, b).
    global:    argmax over paths of first_logits[k_1] + sum_p S_p(k_p, k_{p+1}) (Viterbi).
    geometric: the same with weight lam^(p-1) on S_p (the paper uses lam = 0.75).
    Ties go to the lower rank (at the earliest slot for the path rules); NaN loses to every number.
    """
    _ops.require_tensors(scores=scores, first_logits=first_logits)
    if not isinstance(rule, str):
        raise TypeError(f"rule: expected one of {sorted(_ops.RULES)}, got {rule!r}")
    if backend.native(scores.device):
        return native.select(scores, first_logits, rule, float(lam))
    return torch.ops.dcoco.select(scores, first_logits, rule, float(lam))
