"""DSpark's Markov and confidence heads, a baseline DCOCO is compared with: written here from its public
description (arXiv 2607.05147), not from its code.

The backbone's logits U_k at drafted slot k (over the whole vocabulary) get a first-order Markov term from the
token drawn at the slot before (x_0: the anchor):

    logits_k = U_k + W_1[x_{k-1}] W_2          (W_1: V x r, W_2: r x V, r = 256)

drawn left to right, so each slot computes a vocabulary-sized product once its predecessor is known. A
confidence head estimates how much of the drafter's distribution the target would keep,

    c_k = sigmoid(w . [h_k ; W_1[x_{k-1}]]),

trained towards c*_k = 1 - 1/2 |p_d - p_t|_1 (p_d, p_t: the drafter's and the target's distributions at slot
k); vLLM's adaptive verification reads it. Loss per slot: 0.1 CE(logits, target token) + 0.9 |p_d - p_t|_1 +
1.0 BCE(c_k, c*_k), position-decayed like DFlash's.

DSpark's own drafter predicts the first token at the anchor's position; this head takes any backbone's logits
slot by slot, so on a DFlash drafter it follows DFlash's layout (slot 1 is the first mask position). vLLM serves
that layout too (`sample_from_anchor: false`): checkpoint.save_dspark (`dcoco export --format dspark`) writes a
drafter with this head as the Qwen3 DSpark checkpoint vLLM loads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import checks
from .dflash import decayed_mean

LOSS_WEIGHTS = (0.1, 0.9, 1.0)  # cross-entropy, L1 between the distributions, the confidence's BCE


class DSparkHead(nn.Module):
    """Parameters, named as vLLM's qwen3_dspark.py names its heads' (markov_head.*, confidence_head.*):
    markov_w1.weight (V,r), markov_w2.weight (V,r) (logits += markov_w1[prev] @ markov_w2.weight.T),
    confidence_proj.weight (1, d + r), no bias. markov_w2 starts at zero, so a fresh head drafts the backbone's own
    argmax."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int = 256):
        super().__init__()
        for name, v in (("hidden_size", hidden_size), ("vocab_size", vocab_size), ("rank", rank)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        self.hidden_size, self.vocab_size, self.rank = hidden_size, vocab_size, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        self.confidence_proj = nn.Linear(hidden_size + rank, 1, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=rank ** -0.5)
        nn.init.zeros_(self.markov_w2.weight)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, vocab_size={self.vocab_size}, rank={self.rank}"

    def flops(self, B: int) -> dict[str, int]:
        """Multiply-adds x 2 for one block of B drafted slots: the Markov term (vocabulary-sized) and the
        confidence per slot, the same in a walk and over the grid (the keys of Corrector.flops): the head
        draws one token per slot."""
        n = 2 * B * (self.vocab_size * self.rank + self.hidden_size + self.rank)
        return {"grid": n, "greedy": n}

    def logits(self, base_logits: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """U + W_1[prev] W_2: (R,B,V) float32 for base_logits (R,B,V) and each slot's predecessor prev_ids (R,B)."""
        checks.float_tensor("base_logits", base_logits, 3)
        checks.tensor("prev_ids", prev_ids, 2, "int")
        if prev_ids.shape != base_logits.shape[:2] or base_logits.shape[2] != self.vocab_size:
            raise ValueError(f"base_logits, prev_ids: expected (R,B,{self.vocab_size}) and (R,B), got "
                             f"{tuple(base_logits.shape)} and {tuple(prev_ids.shape)}")
        return base_logits.float() + self.markov_w2(self.markov_w1(prev_ids.long())).float()

    def confidence(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """c (R,B) float32 in (0, 1) for hidden (R,B,d) and prev_ids (R,B)."""
        checks.float_tensor("hidden", hidden, 3)
        if hidden.shape[:2] != prev_ids.shape:
            raise ValueError(f"hidden: expected (R,B,d) with prev_ids' (R,B) = {tuple(prev_ids.shape)}, got "
                             f"{tuple(hidden.shape)}")
        w = self.confidence_proj.weight
        x = torch.cat([hidden.to(w.dtype), self.markov_w1(prev_ids.long())], -1)
        return torch.sigmoid(self.confidence_proj(x)[..., 0].float())

    @torch.no_grad()
    def forward(self, hidden: torch.Tensor, base_logits: torch.Tensor,
                anchor_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy drafting, slot by slot: (tokens (R,B) int64, confidence (R,B) float32)."""
        R, B, _ = base_logits.shape
        tokens = torch.empty(R, B, dtype=torch.long, device=base_logits.device)
        conf = torch.empty(R, B, dtype=torch.float32, device=base_logits.device)
        prev = anchor_ids.long()
        for k in range(B):
            tokens[:, k] = self.logits(base_logits[:, k:k + 1], prev[:, None])[:, 0].argmax(-1)
            conf[:, k] = self.confidence(hidden[:, k:k + 1], prev[:, None])[:, 0]
            prev = tokens[:, k]
        return tokens, conf

    def loss(self, hidden: torch.Tensor, base_logits: torch.Tensor, anchor_ids: torch.Tensor,
             target_ids: torch.Tensor, valid: torch.Tensor, target_logits: torch.Tensor | None = None,
             gamma: float = 7.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, picks): LOSS_WEIGHTS . (CE, |p_d - p_t|_1, BCE(c, c*)) per valid slot, reduced like the DFlash
        loss (decayed_mean); picks (R,B) the teacher-forced argmax of the final logits, detached. Teacher-forced:
        slot k's predecessor is the target's token at k-1, the anchor for slot 1. target_logits (R,B,V): the
        target's logits at the slots (p_t = their softmax); None: p_t is the point mass at target_ids, so
        |p_d - p_t|_1 = 2 (1 - p_d(target))."""
        prev = torch.cat([anchor_ids.long()[:, None], target_ids[:, :-1].long()], 1)
        final = self.logits(base_logits, prev)
        R, B, V = final.shape
        logp = final.log_softmax(-1)
        ce = -logp.gather(-1, target_ids.long()[..., None])[..., 0]
        if target_logits is None:
            l1 = 2 * (1 - (-ce).exp())
        else:
            checks.shape("target_logits", target_logits, (R, B, V), "= base_logits' (R,B,V)")
            l1 = (logp.exp() - target_logits.float().softmax(-1)).abs().sum(-1)
        want = (1 - 0.5 * l1).detach().clamp(0, 1)
        bce = F.binary_cross_entropy(self.confidence(hidden, prev), want, reduction="none")
        a, b, c = LOSS_WEIGHTS
        return decayed_mean(a * ce + b * l1 + c * bce, valid, gamma), final.detach().argmax(-1)
