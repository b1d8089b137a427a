"""DFlash2's candidate selector, the baseline DCOCO is compared with: written here from its public description
(the DFlash 2 blog, "Keep Drafting Parallel", and the structure of vLLM's qwen3_dflash2.py CandidateSelector),
not from its code.

Per drafted slot t, over the drafter's top-K candidates c_t1..c_tK with logits u_t:
    score_t(k) = u_t(k) + sum_j pred[prev_t]_j (W h_t)_j succ[c_tk]_j
a unary term plus a rank-r bilinear transition term: W (r,d) projects the slot's drafter hidden state; pred and
succ are two (V,r) token codebooks for the predecessor and the successor. prev_1 is the anchor (the last
committed token), prev_t the token chosen at slot t-1: the walk goes left to right, one argmax per slot. Unlike
DCOCO's prefix-first walk, slot 1 can move off rank 0 (its predecessor, the anchor, is known).

Training (our reading of the description, no published loss): teacher-forced, prev_t is the verifier's token
at slot t-1 (the anchor for slot 1); cross-entropy over the K scores towards the verifier's token at slot t,
on slots where that token is in the top-K."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CandidateSelector(nn.Module):
    """Parameters: proj.weight (r,d), pred.weight (V,r), succ.weight (V,r). succ starts at zero, so a fresh
    selector keeps the drafter's argmax (like a fresh DCOCO corrector)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int = 32, num_candidates: int = 16):
        super().__init__()
        for name, v in (("hidden_size", hidden_size), ("vocab_size", vocab_size), ("rank", rank),
                        ("num_candidates", num_candidates)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        self.hidden_size, self.vocab_size, self.rank = hidden_size, vocab_size, rank
        self.num_candidates = num_candidates
        self.proj = nn.Linear(hidden_size, rank, bias=False)
        self.pred = nn.Embedding(vocab_size, rank)
        self.succ = nn.Embedding(vocab_size, rank)
        nn.init.normal_(self.proj.weight, std=hidden_size ** -0.5)
        nn.init.normal_(self.pred.weight, std=1.0)
        nn.init.zeros_(self.succ.weight)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, vocab_size={self.vocab_size}, rank={self.rank}"

    def flops(self, B: int, K: int) -> dict[str, int]:
        """Multiply-adds x 2 for one block of B slots and K candidates (projection, predecessor gate, K dot
        products per slot); the walk scores one row per slot, like DCOCO's greedy walk."""
        n = 2 * (B * self.hidden_size * self.rank + B * self.rank + B * K * self.rank)
        return {"grid": n, "greedy": n}

    def score(self, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
              prev_ids: torch.Tensor) -> torch.Tensor:
        """Scores (R,B,K) float32 of every slot's candidates given its predecessor token prev_ids (R,B).
        hidden (R,B,d); cand_ids / cand_logits (R,B,K)."""
        R, B, K = cand_ids.shape
        if hidden.shape[:2] != (R, B) or cand_logits.shape != (R, B, K) or prev_ids.shape != (R, B):
            raise ValueError(f"hidden, cand_logits, prev_ids: expected (R,B,d), (R,B,K), (R,B) with (R,B,K) = "
                             f"{(R, B, K)}, got {tuple(hidden.shape)}, {tuple(cand_logits.shape)}, "
                             f"{tuple(prev_ids.shape)}")
        g = self.proj(hidden.to(self.proj.weight.dtype)) * self.pred(prev_ids)            # (R,B,r)
        return cand_logits.float() + torch.einsum("rbj,rbkj->rbk", g, self.succ(cand_ids)).float()

    @torch.no_grad()
    def forward(self, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
                anchor_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The greedy walk: (ranks, tokens), both int64 (R,B). anchor_ids (R,): each block's anchor token."""
        R, B, _ = cand_ids.shape
        g = self.proj(hidden.to(self.proj.weight.dtype))                                  # (R,B,r)
        succ = self.succ(cand_ids)                                                         # (R,B,K,r)
        prev = anchor_ids.long()
        ranks = torch.empty(R, B, dtype=torch.long, device=cand_ids.device)
        for t in range(B):  # each slot's predecessor is the previous slot's pick
            s = cand_logits[:, t].float() + torch.einsum("rj,rkj->rk", g[:, t] * self.pred(prev), succ[:, t]).float()
            ranks[:, t] = s.argmax(-1)
            prev = cand_ids[:, t].gather(1, ranks[:, t:t + 1])[:, 0]
        return ranks, cand_ids.gather(2, ranks[..., None])[..., 0]

    def loss(self, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor, anchor_ids: torch.Tensor,
             target_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Teacher-forced cross-entropy over each slot's K scores towards target_ids (R,B) (the verifier's tokens),
        predecessor = the previous slot's target (the anchor for slot 1); mean over the valid (R,B) slots whose
        target is in the top-K (0 when there is none)."""
        prev = torch.cat([anchor_ids.long()[:, None], target_ids[:, :-1].long()], 1)
        s = self.score(hidden, cand_ids, cand_logits, prev)
        match = cand_ids == target_ids[..., None]
        ok = match.any(-1) & valid
        ce = F.cross_entropy(s.reshape(-1, s.shape[-1]), match.int().argmax(-1).reshape(-1), reduction="none")
        return (ce * ok.reshape(-1)).sum() / ok.sum().clamp_min(1)
