"""Domino's residual head, a baseline DCOCO is compared with: written here from its public description (arXiv
2605.29707), not from its code.

The DFlash backbone's block logits U_n (over the whole vocabulary) get a correction from the tokens the block has
already chosen. A one-layer GRU without biases runs over their embeddings (the target's frozen table): the anchor
x_0, then each slot's pick. At slot n,

    g_n = GRU(E[x_0], ..., E[x_{n-1}])                   (hidden 1024)
    logits_n = U_n + W_2 SiLU(W_1 [z_n ; g_n] + b_1) + b_2   (W_1: 256 x (d + 1024), W_2: V x 256)

with z_n the backbone's hidden state at slot n. The first slot takes U_1 alone (the paper's
pure_draft_prefix_len = 1). Drafting is sequential: slot n's pick is slot n+1's GRU input, and every slot
computes a vocabulary-sized product.

Training (teacher-forced: the GRU reads the verifier's tokens): (1 - lam) CE(logits) + lam CE(U) per slot,
position-decayed like DFlash's loss; lam goes linearly from 1 to 0 over training (the "base-anchored
curriculum", `curriculum`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import checks
from .dflash import decayed_mean


class DominoHead(nn.Module):
    """Parameters: gru (weight_ih_l0 (3G, d_e), weight_hh_l0 (3G, G)), mix (256, d + G) with bias, out (V, 256)
    with bias. out starts at zero, so a fresh head drafts the backbone's own argmax."""

    def __init__(self, hidden_size: int, embed_size: int, vocab_size: int, gru_size: int = 1024,
                 mid_size: int = 256):
        super().__init__()
        for name, v in (("hidden_size", hidden_size), ("embed_size", embed_size), ("vocab_size", vocab_size),
                        ("gru_size", gru_size), ("mid_size", mid_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        self.hidden_size, self.embed_size, self.vocab_size = hidden_size, embed_size, vocab_size
        self.gru_size, self.mid_size = gru_size, mid_size
        self.gru = nn.GRU(embed_size, gru_size, num_layers=1, bias=False, batch_first=True)
        self.mix = nn.Linear(hidden_size + gru_size, mid_size)
        self.out = nn.Linear(mid_size, vocab_size)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, embed_size={self.embed_size}, vocab_size={self.vocab_size}, "
                f"gru_size={self.gru_size}, mid_size={self.mid_size}")

    def flops(self, B: int) -> dict[str, int]:
        """Multiply-adds x 2 for one block of B drafted slots: B-1 GRU steps, then the correction of slots 2..B
        (the vocabulary-sized product dominates); the same in a walk and over the grid (the keys of
        Corrector.flops): the head draws one token per slot."""
        G, n = self.gru_size, B - 1
        gru = 3 * G * (self.embed_size + G)
        flops = 2 * n * (gru + self.mid_size * (self.hidden_size + G) + self.vocab_size * self.mid_size)
        return {"grid": flops, "greedy": flops}

    def _correct(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """W_2 SiLU(W_1 [z ; g] + b_1) + b_2 for backbone states z (..., d) and GRU states g (..., G)."""
        w = self.mix.weight
        return self.out(F.silu(self.mix(torch.cat([hidden.to(w.dtype), state.to(w.dtype)], -1)))).float()

    def logits(self, hidden: torch.Tensor, base_logits: torch.Tensor, prev_ids: torch.Tensor,
               embed: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (R,B,V) float32 of B drafted slots: base_logits U (R,B,V), plus from slot 2 on
        the correction. prev_ids (R,B): each slot's predecessor token (the anchor for slot 1, then the tokens the
        slots before chose); the GRU reads them in order, so slot n sees x_0..x_{n-1}. hidden (R,B,d),
        embed (V,d_e) the target's frozen table."""
        checks.float_tensor("hidden", hidden, 3)
        checks.float_tensor("base_logits", base_logits, 3)
        checks.tensor("prev_ids", prev_ids, 2, "int")
        R, B, V = base_logits.shape
        if hidden.shape[:2] != (R, B) or prev_ids.shape != (R, B) or V != self.vocab_size:
            raise ValueError(f"hidden, base_logits, prev_ids: expected (R,B,d), (R,B,{self.vocab_size}), (R,B); got "
                             f"{tuple(hidden.shape)}, {tuple(base_logits.shape)}, {tuple(prev_ids.shape)}")
        g, _ = self.gru(embed[prev_ids.long()].to(self.mix.weight.dtype))  # g[:, j]: read x_0..x_j
        return torch.cat([base_logits[:, :1].float(),
                          base_logits[:, 1:].float() + self._correct(hidden[:, 1:], g[:, 1:])], 1)

    @torch.no_grad()
    def forward(self, hidden: torch.Tensor, base_logits: torch.Tensor, anchor_ids: torch.Tensor,
                embed: torch.Tensor) -> torch.Tensor:
        """Greedy drafting: tokens (R,B) int64, slot by slot (a slot's pick is the GRU's next input).
        hidden (R,B,d), base_logits (R,B,V), anchor_ids (R,), embed (V,d_e)."""
        R, B, V = base_logits.shape
        dtype = self.mix.weight.dtype
        tokens = torch.empty(R, B, dtype=torch.long, device=base_logits.device)
        tokens[:, 0] = base_logits[:, 0].float().argmax(-1)
        _, state = self.gru(embed[anchor_ids.long()][:, None].to(dtype))  # has read x_0
        for n in range(1, B):
            _, state = self.gru(embed[tokens[:, n - 1]][:, None].to(dtype), state)
            tokens[:, n] = (base_logits[:, n].float() + self._correct(hidden[:, n], state[0])).argmax(-1)
        return tokens

    def loss(self, hidden: torch.Tensor, base_logits: torch.Tensor, anchor_ids: torch.Tensor,
             target_ids: torch.Tensor, valid: torch.Tensor, embed: torch.Tensor, lam: float,
             gamma: float = 7.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, picks): (1 - lam) CE(logits) + lam CE(U) per valid slot, reduced like the DFlash loss
        (decayed_mean); picks (R,B) the teacher-forced argmax of the final logits, detached (the GRU reads the
        anchor then target_ids, so the leading run of right picks is the greedy walk's)."""
        if not (isinstance(lam, (int, float)) and 0 <= lam <= 1):
            raise ValueError(f"lam: expected a number in [0, 1], got {lam!r}")
        prev = torch.cat([anchor_ids.long()[:, None], target_ids[:, :-1].long()], 1)
        final = self.logits(hidden, base_logits, prev, embed)
        R, B, V = final.shape
        labels = target_ids.long().reshape(-1)
        ce = (1 - lam) * F.cross_entropy(final.reshape(-1, V), labels, reduction="none")
        if lam:
            ce = ce + lam * F.cross_entropy(base_logits.float().reshape(-1, V), labels, reduction="none")
        return decayed_mean(ce.view(R, B), valid, gamma), final.detach().argmax(-1)


def curriculum(step: float, total: float) -> float:
    """The base-anchored curriculum's lam at a step: 1 at the start, linearly to 0 at the end."""
    return max(0.0, 1.0 - step / total) if total > 0 else 0.0

