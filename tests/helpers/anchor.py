"""Fresh random cases of the anchor transition (docs/spec.md, "Anchor transition"): a corrector with the extension on,
the anchor's hidden state at position 0, and the float64 literal S_0 and grid to check against."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

import dcoco
from dcoco.testing import reference as ref

from helpers.cases import Case, make_case


@dataclasses.dataclass
class AnchorCase:
    corrector: dcoco.Corrector  # anchor_transition=True
    plain: dcoco.Corrector      # the same weights, the extension off
    hidden: torch.Tensor        # (R,B+1,d), position 0 the anchor's
    cand_ids: torch.Tensor      # (R,B,K)
    cand_logits: torch.Tensor   # (R,B,K)
    embed: torch.Tensor
    anchor_ids: torch.Tensor    # (R,)

    @property
    def inputs(self):
        return self.hidden, self.cand_ids, self.cand_logits, self.embed

    def weights64(self):
        return [w.detach().double() for w in self.corrector.weights()]

    def ref_first(self) -> torch.Tensor:
        """S_0 (R,K), the literal formula in float64 on the (upcast) inputs."""
        return ref.anchor_scores(self.hidden.double(), self.cand_ids, self.cand_logits.double(), self.anchor_ids,
                                 self.embed.double(), *self.weights64())

    def ref_grid(self) -> torch.Tensor:
        """S_1..S_{B-1} (R,B-1,K,K), the literal formula in float64."""
        return ref.score(self.hidden[:, 1:].double(), self.cand_ids, self.cand_logits.double(), self.embed.double(),
                         *self.weights64())

    def slots(self) -> Case:
        """The core's B+1-slot inputs as Corrector._slots builds them: slot 0 holds K copies of the anchor, logits 0."""
        R, B, K = self.cand_ids.shape
        ids = torch.cat([self.anchor_ids.to(self.cand_ids.dtype)[:, None, None].expand(R, 1, K), self.cand_ids], 1)
        return Case(self.corrector, self.hidden, ids, F.pad(self.cand_logits, (0, 0, 1, 0)), self.embed)


def make_anchor_case(R, B, K, d, V=None, dtype=torch.float32, id_dtype=torch.int64, seed=0, r=128, H=256
                     ) -> AnchorCase:
    """make_case's active corrector and inputs over B+1 positions; position 0's candidates are dropped and its
    hidden state kept as the anchor's, and the anchor token is a fresh random id."""
    c = make_case(R, B + 1, K, d, V=V, dtype=dtype, id_dtype=id_dtype, seed=seed, r=r, H=H)
    m = dcoco.Corrector(d, num_candidates=K, width=r, mlp_hidden=H, anchor_transition=True)
    m.load_state_dict(c.corrector.state_dict())
    anchor = torch.randint(0, c.embed.shape[0], (R,), generator=torch.Generator().manual_seed(seed + 1))
    return AnchorCase(m, c.corrector, c.hidden, c.cand_ids[:, 1:].contiguous(), c.cand_logits[:, 1:].contiguous(),
                      c.embed, anchor.to(id_dtype))


def anchored(first: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The B+1-slot grid (R,B,K,K) the core sees: slot 0's rows all S_0, then S_1..S_{B-1}."""
    R, K = first.shape
    return torch.cat([first[:, None, None, :].expand(R, 1, K, K), grid], 1)
