"""A shortlisted draft head: the drafter's logits over N target tokens only (the N most frequent response tokens of
its training corpus), so a draft step computes N rows of the LM head instead of the whole vocabulary.

Lossless by construction: the target still verifies every drafted token; a token off the list is simply never
drafted. It is stored in the layout vLLM reads for a reduced draft vocabulary (its DFlash drafter's
`draft_vocab_size` and `d2t`): config.json `draft_vocab_size: N` and `has_own_lm_head: true`; model.safetensors
`lm_head.weight` (N, d), the target head's rows for the list, and `d2t` (N,) int64, draft id i standing for target
id i + d2t[i]. The list is sorted by target id."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HEAD = "lm_head.weight"
D2T = "d2t"
TENSORS = (HEAD, D2T)


def check_ids(ids: torch.Tensor, vocab_size: int, where: str) -> torch.Tensor:
    """ids as a sorted int64 list of distinct target ids in [0, vocab_size); ValueError naming where otherwise."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{where}: expected a 1-D integer tensor of target token ids")
    if len(ids) == 0:
        raise ValueError(f"{where}: the draft vocabulary is empty")
    ids = ids.long()
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if len(bad):
        raise ValueError(f"{where}: token ids out of the target's vocabulary [0, {vocab_size}): "
                         f"{bad[:8].tolist()}")
    ids = ids.sort().values
    dup = ids[1:][ids[1:] == ids[:-1]]
    if len(dup):
        raise ValueError(f"{where}: token ids listed more than once: {dup.unique()[:8].tolist()}")
    return ids


class DraftHead(nn.Module):
    """The drafter's LM head over a token list: ids (N,) sorted target ids, weight (N, d) their head rows. Both are
    buffers kept out of the drafter's state_dict (written under the layout's own names by tensors())."""

    ids: torch.Tensor
    weight: torch.Tensor

    def __init__(self, ids: torch.Tensor, weight: torch.Tensor, vocab_size: int, where: str = "ids"):
        super().__init__()
        ids = check_ids(ids, vocab_size, where)
        if weight.dim() != 2 or weight.shape[0] != len(ids):
            raise ValueError(f"{where}: {len(ids)} token ids but a head of shape {tuple(weight.shape)}")
        self.vocab_size = vocab_size
        self.register_buffer("ids", ids, persistent=False)
        self.register_buffer("weight", weight.detach(), persistent=False)

    @classmethod
    def from_target(cls, head: torch.Tensor, ids: torch.Tensor) -> DraftHead:
        """The shortlist ids (any order, distinct) of the target's (V, d) LM head."""
        ids = check_ids(ids, head.shape[0], "ids")
        return cls(ids, head.detach()[ids.to(head.device)], head.shape[0])

    def __len__(self) -> int:
        return len(self.ids)

    def top(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k over the list of hidden (..., d): target ids and float32 logits (..., min(k, N)), sorted by
        logit."""
        logits = F.linear(hidden.contiguous(), self.weight.to(hidden.dtype)).float()
        t = logits.topk(min(k, len(self)), -1)
        return self.ids[t.indices], t.values

    def tensors(self) -> dict[str, torch.Tensor]:
        """The layout's tensors: lm_head.weight and d2t (target id - draft id)."""
        return {HEAD: self.weight, D2T: self.ids - torch.arange(len(self), device=self.ids.device)}

    def config(self) -> dict:
        return {"draft_vocab_size": len(self), "has_own_lm_head": True}


def from_checkpoint(config: dict, tensors: dict[str, torch.Tensor], where: str) -> DraftHead | None:
    """The DraftHead a checkpoint declares (config draft_vocab_size below vocab_size, with lm_head.weight and d2t),
    or None for a whole-vocabulary drafter; ValueError naming where and what is missing or wrong."""
    n, vocab = config.get("draft_vocab_size"), config.get("vocab_size")
    if n is None or n == vocab:
        extra = sorted(k for k in TENSORS if k in tensors)
        if extra:
            raise ValueError(f"{where}: holds {extra} but config.json has no draft_vocab_size below vocab_size")
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not isinstance(vocab, int) or not 0 < n < vocab:
        raise ValueError(f"{where}: draft_vocab_size: expected an integer in [1, {vocab}), got {n!r}")
    missing = [k for k in TENSORS if k not in tensors]
    if missing:
        raise ValueError(f"{where}: config.json declares draft_vocab_size {n} but the checkpoint has no "
                         f"{' or '.join(missing)}")
    d2t, weight = tensors[D2T], tensors[HEAD]
    if d2t.shape != (n,):
        raise ValueError(f"{where}: d2t has shape {tuple(d2t.shape)}, expected ({n},) for draft_vocab_size {n}")
    ids = d2t.long() + torch.arange(n)
    return DraftHead(ids, weight, vocab, f"{where}: d2t")
