"""The correction loss L_corr (docs/spec.md, "Training"; the paper's eq. 9): one weighted K x K cross-entropy
per adjacent slot pair."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .ops import checks


def correction_loss(scores: torch.Tensor, cand_ids: torch.Tensor, target_ids: torch.Tensor, valid: torch.Tensor,
                    rho: float = 4.0, anchor_scores: torch.Tensor | None = None) -> torch.Tensor:
    """L_corr = -(1/Z) sum_{r,p} w_p m_p log softmax_{(a,b) in KxK}(S_p)[a*_p, b*_p], a scalar.

    scores (R,B-1,K,K): scores[r,p-1,a,b] = S_p(a,b), the transition from slot p to p+1 (p = 1..B-1).
    cand_ids (R,B,K): top-K candidate ids per drafted slot, rank order.
    target_ids (R,B): the verifier's argmax token at every drafted slot.
    valid (R,B) bool: the alignment mask (inside the sequence, not padding).
    Label rank of a slot = index of the first match of target_ids in cand_ids. m_p = 1 iff slots p and p+1
    are both valid and both labels are found; w_p = exp(-(p-1)/rho); Z = max(1, sum_{r,p} w_p m_p) over the
    whole batch (one weighted mean, not a mean of per-block means). With no supervised transition the loss
    is 0 with zero gradient. Computed in float32 at least (float64 stays float64); differentiable in scores.

    anchor_scores (R,K): S_0 of the anchor transition (Corrector.walk_inputs' first), for the extension's term
    -w_0 m_0 log softmax_b(S_0)[b*_1], a softmax over slot 1's K candidates, w_0 = 1, m_0 = 1 iff slot 1 is valid
    and its label found; Z includes w_0 m_0. None: the paper's loss.
    """
    checks.tensor("scores", scores, 4, "float")
    checks.tensor("cand_ids", cand_ids, 3, "int")
    checks.tensor("target_ids", target_ids, 2, "int")
    checks.tensor("valid", valid, 2, "bool")
    R, T, K, K2 = scores.shape
    if K != K2 or K < 1 or T < 1:
        raise ValueError(f"scores: expected (R,B-1,K,K) with B >= 2, K >= 1, got {tuple(scores.shape)}")
    if cand_ids.shape != (R, T + 1, K):
        raise ValueError(f"cand_ids: expected shape {(R, T + 1, K)} to match scores, got {tuple(cand_ids.shape)}")
    for name, t in (("target_ids", target_ids), ("valid", valid)):
        if t.shape != (R, T + 1):
            raise ValueError(f"{name}: expected shape {(R, T + 1)} to match scores, got {tuple(t.shape)}")
    for name, t in (("cand_ids", cand_ids), ("target_ids", target_ids), ("valid", valid)):
        if t.device != scores.device:
            raise ValueError(f"{name}: on {t.device}, scores on {scores.device}")
    if anchor_scores is not None:
        checks.tensor("anchor_scores", anchor_scores, 2, "float")
        if anchor_scores.shape != (R, K) or anchor_scores.device != scores.device:
            raise ValueError(f"anchor_scores: expected shape {(R, K)} on {scores.device} to match scores, got "
                             f"{tuple(anchor_scores.shape)} on {anchor_scores.device}")
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not math.isfinite(rho) or rho <= 0:
        raise ValueError(f"rho: expected a finite number > 0, got {rho!r}")

    match = cand_ids.long() == target_ids[..., None].long()               # (R,B,K), never narrowing a label
    rank = match.int().argmax(-1)                                          # first match; 0 when absent
    ok = match.any(-1) & valid                                             # (R,B)
    m = ok[:, :-1] & ok[:, 1:]                                             # (R,B-1)
    w = torch.exp(-torch.arange(T, device=scores.device, dtype=torch.float64) / rho)
    wm = (w * m).to(torch.promote_types(scores.dtype, torch.float32))     # (R,B-1)

    logp = F.log_softmax(scores.to(wm.dtype).reshape(R, T, K * K), -1)
    picked = logp.gather(-1, (rank[:, :-1] * K + rank[:, 1:])[..., None]).squeeze(-1)
    picked = torch.where(m, picked, torch.zeros_like(picked))             # a dropped -inf must not give NaN
    total, weight = (wm * picked).sum(), wm.sum()
    if anchor_scores is not None:
        m0 = ok[:, 0]
        logp0 = F.log_softmax(anchor_scores.to(wm.dtype), -1).gather(-1, rank[:, :1]).squeeze(-1)
        total = total + torch.where(m0, logp0, torch.zeros_like(logp0)).sum()
        weight = weight + m0.sum()
    return -total / weight.clamp_min(1.0)
