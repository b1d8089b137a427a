"""The drafter's pass through the target's frozen LM head during training, in row chunks: per-slot cross-entropy
and the top-K candidates, without ever holding a full (rows, V) logits tensor (nor its float32 copy).

With gradients on and more than one chunk, each chunk runs under activation checkpointing, so backward recomputes
that chunk's logits instead of keeping them all: peak memory is one chunk's logits, at the price of one more head
matmul in backward. When everything fits in one chunk nothing is recomputed (what small CPU runs do).

`shortlist_ce` is the cheap step: the same loss over a candidate vocabulary (a shortlist plus the batch's labels)
instead of all V rows, where the head is most of a step's cost; `whole_head_topk` gives a shortlisted joint step
the whole head's top-K for the corrector, with gradients through those K logits only."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..logit_chunks import chunk_rows
from ..ops import checks
from .dflash import DFlashDrafter

Teacher = tuple[torch.Tensor, torch.Tensor]  # (ids, p) (...,n): a distribution over n tokens per row


def _ce(logits: torch.Tensor, labels: torch.Tensor, teacher: Teacher | None) -> torch.Tensor:
    """Per-row float32 cross-entropy of logits (rows,C) against labels (rows,) (class indices), or with teacher,
    against its distribution: -sum_j p_j log softmax(logits)[ids_j] (ids (rows,n) class indices)."""
    if teacher is None:
        return F.cross_entropy(logits.float(), labels, reduction="none")
    ids, p = teacher
    return -(p.float() * logits.float().log_softmax(-1).gather(-1, ids)).sum(-1)


def _part(x: torch.Tensor, head: torch.Tensor, labels: torch.Tensor | None, k: int,
          teacher: Teacher | None = None):
    logits = DFlashDrafter.compute_logits(x, head)  # (n,V) in the autocast / hidden dtype
    top = logits.topk(k, dim=-1)
    ce = _ce(logits, labels, teacher) if labels is not None else None
    return ce, top.values, top.indices


def _check(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor | None,
           teacher: Teacher | None = None) -> None:
    checks.last_dim("hidden", hidden, head.shape[1], "(the head's)")
    if labels is not None:
        checks.shape("labels", labels, hidden.shape[:-1], "to match hidden")
    if teacher is not None:
        if labels is None:
            raise ValueError("teacher: replaces the labels' one-hot target, so labels must be given too")
        ids, p = teacher
        checks.shape("teacher ids", ids, (*labels.shape, ids.shape[-1]), "(labels' shape, n)")
        checks.shape("teacher p", p, ids.shape, "to match the teacher's ids")
        if ids.numel() and bool(((ids < 0) | (ids >= head.shape[0])).any()):
            raise ValueError(f"teacher ids: must lie in [0, {head.shape[0]})")


def topk_ce(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor | None, k: int,
            rows: int | None = None, teacher: Teacher | None = None
            ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(ce, values, ids) for hidden (...,d) through head (V,d): ce (...) float32 cross-entropy against labels (...)
    (None when labels is None), values / ids (...,k) the top-k logits (logits dtype, differentiable) and their
    token ids, rank 0 = argmax. rows: rows per chunk (default: chunk_rows). Labels must lie in [0, V).
    teacher: (ids, p) (...,n), a distribution over n tokens per row that replaces the labels' one-hot as ce's
    target (distillation; labels then only mark the rows)."""
    V, d = head.shape
    _check(hidden, head, labels, teacher)
    if not 1 <= k <= V:
        raise ValueError(f"k: expected 1..{V}, got {k}")
    lead = hidden.shape[:-1]
    x = hidden.reshape(-1, d).contiguous()
    if not torch.is_autocast_enabled(x.device.type):
        head = head.to(x.dtype)  # once, not per chunk (autocast casts per matmul: a bf16 head needs nothing)
    lab = None
    if labels is not None:
        lab = labels.reshape(-1).long()
        if lab.numel() and bool(((lab < 0) | (lab >= V)).any()):
            raise ValueError(f"labels: must lie in [0, {V})")
    n, step = x.shape[0], chunk_rows(V, rows)
    recompute = torch.is_grad_enabled() and x.requires_grad and n > step
    flat = None if teacher is None else (teacher[0].reshape(n, -1).long(), teacher[1].reshape(n, -1))
    parts = []
    for i in range(0, max(n, 1), step):
        args = (x[i:i + step], head, None if lab is None else lab[i:i + step], k,
                None if flat is None else (flat[0][i:i + step], flat[1][i:i + step]))
        parts.append(checkpoint(_part, *args, use_reentrant=False) if recompute else _part(*args))
    ce = torch.cat([p[0] for p in parts]).view(lead) if lab is not None else None
    values = torch.cat([p[1] for p in parts]).view(*lead, k)
    ids = torch.cat([p[2] for p in parts]).view(*lead, k)
    return ce, values, ids


def shortlist_ce(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor, vocab: torch.Tensor, k: int,
                 teacher: Teacher | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ce's (ce, values, ids) with the softmax and the top-k restricted to the rows vocab (n,) of head plus
    every label (and every teacher token): ce is the cross-entropy over those candidates only (a sampled softmax
    without sampling), the top-k is the candidates' top-k. Exact when no other token's logit matters;
    bench/levers.py measures it."""
    V, d = head.shape
    _check(hidden, head, labels, teacher)
    lab = labels.reshape(-1).long()
    extra = [] if teacher is None else [teacher[0].reshape(-1).to(lab.device, torch.long)]
    cand = torch.unique(torch.cat([vocab.to(lab.device, torch.long), lab, *extra]))  # sorted: ids map by search
    if not 1 <= k <= cand.numel():
        raise ValueError(f"k: expected 1..{cand.numel()} (the candidate vocabulary), got {k}")
    if bool((cand[0] < 0) | (cand[-1] >= V)):
        raise ValueError(f"labels / vocab: token ids must lie in [0, {V})")
    x = hidden.reshape(-1, d)
    logits = DFlashDrafter.compute_logits(x, head[cand])  # (rows, n')
    mapped = None
    if teacher is not None:  # the teacher's tokens as indices into the candidates
        mapped = (torch.searchsorted(cand, teacher[0].reshape(len(lab), -1).long().contiguous()),
                  teacher[1].reshape(len(lab), -1))
    ce = _ce(logits, torch.searchsorted(cand, lab), mapped).view(labels.shape)
    top = logits.topk(k, dim=-1)
    return ce, top.values.view(*labels.shape, k), cand[top.indices].view(*labels.shape, k)


def whole_head_topk(h: torch.Tensor, head: torch.Tensor, k: int, rows: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) (...,k): the top-k of h's logits over the whole head, the ids found without gradients (one
    forward matmul, no (rows, V) tensor kept for backward) and the values recomputed from those k rows with
    gradients into h: what topk_ce returns, at the cost of k rows per slot in backward."""
    with torch.no_grad():
        ids = topk_ce(h.detach(), head, None, k, rows)[2]
    rows_w = head[ids]  # (...,k,d)
    if not torch.is_autocast_enabled(h.device.type):
        rows_w = rows_w.to(h.dtype)
    return (rows_w @ h.unsqueeze(-1)).squeeze(-1), ids
