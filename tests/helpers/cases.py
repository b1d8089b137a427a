"""Fresh random corrector cases and the checks of a walk against the literal reference."""

from __future__ import annotations

import dataclasses

import torch

import dcoco
from dcoco.ops import native
from dcoco.testing import reference as ref


def backend_score(hidden, cand_ids, cand_logits, embed, weights):
    """dcoco's scores under the current backend, from loose weights (for gradcheck)."""
    if dcoco.get_backend() == "native":
        return native.score(hidden, cand_ids, cand_logits, embed, weights)
    return torch.ops.dcoco.score(hidden, cand_ids, cand_logits, embed, *weights)


@dataclasses.dataclass
class Case:
    corrector: dcoco.Corrector
    hidden: torch.Tensor
    cand_ids: torch.Tensor
    cand_logits: torch.Tensor
    embed: torch.Tensor

    @property
    def inputs(self):
        return self.hidden, self.cand_ids, self.cand_logits, self.embed

    def ref_scores(self) -> torch.Tensor:
        """The literal formula in float64 on the same (upcast) inputs and weights."""
        return ref.score(self.hidden.double(), self.cand_ids, self.cand_logits.double(), self.embed.double(),
                         *(w.double() for w in self.corrector.weights()))


def make_case(R, B, K, d, V=None, dtype=torch.float32, id_dtype=torch.int64, seed=0, r=128, H=256) -> Case:
    """A corrector whose output layer is active (not zero) and inputs where it changes the walk:
    candidate logits sorted per slot with gaps comparable to the MLP's corrections."""
    g = torch.Generator().manual_seed(seed)
    V = V or max(4 * K, 97)
    m = dcoco.Corrector(d, num_candidates=K, width=r, mlp_hidden=H)
    with torch.no_grad():
        for name, p in m.named_parameters():
            fan_in = p.shape[-1] if p.dim() == 2 else 1
            std = 1.0 / fan_in ** 0.5
            if name == "mlp.2.weight":
                std = 3.0 / H ** 0.5
            p.copy_(torch.randn(p.shape, generator=g) * std + (1.0 if name == "fuse_norm.weight" else 0.0))
    hidden = torch.randn(R, B, d, generator=g).to(dtype)
    embed = torch.randn(V, d, generator=g).to(dtype)
    cand_ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(R * B)]).view(R, B, K).to(id_dtype)
    cand_logits = (torch.randn(R, B, K, generator=g) * 0.7).sort(-1, descending=True).values.to(dtype)
    return Case(m, hidden, cand_ids, cand_logits, embed)


def assert_walk_matches(ranks: torch.Tensor, ref_scores: torch.Tensor, first_logits: torch.Tensor, atol: float):
    """ranks is a greedy walk of ref_scores: slot 1 exactly the argmax, and every later choice within
    atol of the row maximum of its chosen predecessor (exact ties may go either way only within atol)."""
    R, T, K, _ = ref_scores.shape
    assert ranks.shape == (R, T + 1) and ranks.dtype == torch.int64
    assert ((ranks >= 0) & (ranks < K)).all()
    assert torch.equal(ranks[:, 0], first_logits.float().argmax(-1))
    for q in range(R):
        for p in range(T):
            row = ref_scores[q, p, ranks[q, p]]
            assert row[ranks[q, p + 1]] >= row.max() - atol, (q, p, row, ranks[q])
