"""Fresh random corrector cases, with or without the anchor transition (docs/spec.md, "Anchor transition"), the
float64 literal scores to check them against, and the check of a walk."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

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
    hidden: torch.Tensor        # (R,B,d); with the anchor transition (R,B+1,d), position 0 the anchor's
    cand_ids: torch.Tensor      # (R,B,K)
    cand_logits: torch.Tensor   # (R,B,K)
    embed: torch.Tensor
    anchor_ids: torch.Tensor | None = None  # (R,): the anchor transition is on
    plain: dcoco.Corrector | None = None    # with the anchor transition: the same weights, the extension off

    @property
    def inputs(self):
        return self.hidden, self.cand_ids, self.cand_logits, self.embed

    @property
    def kw(self) -> dict:
        """The anchor's keyword for score and forward (none without the extension)."""
        return {} if self.anchor_ids is None else {"anchor_ids": self.anchor_ids}

    def weights64(self):
        return [w.detach().double() for w in self.corrector.weights()]

    def ref_scores(self) -> torch.Tensor:
        """The transitions S_1..S_{B-1} (R,B-1,K,K): the literal formula in float64 on the same (upcast) inputs."""
        h = self.hidden if self.anchor_ids is None else self.hidden[:, 1:]
        return ref.score(h.double(), self.cand_ids, self.cand_logits.double(), self.embed.double(), *self.weights64())

    def ref_first(self) -> torch.Tensor:
        """What slot 1 is ranked by (R,K): the drafter's logits, or with the extension S_0, the literal formula."""
        if self.anchor_ids is None:
            return self.cand_logits[:, 0].double()
        return ref.anchor_scores(self.hidden.double(), self.cand_ids, self.cand_logits.double(), self.anchor_ids,
                                 self.embed.double(), *self.weights64())

    def core_walk(self, ranks: torch.Tensor, first: torch.Tensor, grid: torch.Tensor):
        """(walk, grid, first logits) of the greedy walk the core takes: with the extension it starts at the
        anchor, its one candidate (rank 0 of K zero logits), and slot 0's rows of the grid are all S_0."""
        if self.anchor_ids is None:
            return ranks, grid, first
        R, K = first.shape
        walk = torch.cat([torch.zeros(R, 1, dtype=torch.int64), ranks], 1)
        return walk, torch.cat([first[:, None, None, :].expand(R, 1, K, K), grid], 1), torch.zeros(R, K)

    def slots(self) -> Case:
        """The core's B+1-slot inputs as Corrector._slots builds them: slot 0 holds K copies of the anchor, logits 0."""
        R, B, K = self.cand_ids.shape
        ids = torch.cat([self.anchor_ids.to(self.cand_ids.dtype)[:, None, None].expand(R, 1, K), self.cand_ids], 1)
        return Case(self.corrector, self.hidden, ids, F.pad(self.cand_logits, (0, 0, 1, 0)), self.embed)


def make_case(R, B, K, d, V=None, dtype=torch.float32, id_dtype=torch.int64, seed=0, r=128, H=256,
              anchor: bool = False) -> Case:
    """A corrector whose output layer is active (not zero) and inputs where it changes the walk:
    candidate logits sorted per slot with gaps comparable to the MLP's corrections. anchor: the corrector has the
    anchor transition, the inputs are drawn over B+1 positions, position 0's candidates dropped and its hidden
    state kept as the anchor's, and the anchor token is a fresh random id."""
    if anchor:
        c = make_case(R, B + 1, K, d, V=V, dtype=dtype, id_dtype=id_dtype, seed=seed, r=r, H=H)
        m = dcoco.Corrector(d, num_candidates=K, width=r, mlp_hidden=H, anchor_transition=True)
        m.load_state_dict(c.corrector.state_dict())
        ids = torch.randint(0, c.embed.shape[0], (R,), generator=torch.Generator().manual_seed(seed + 1))
        return Case(m, c.hidden, c.cand_ids[:, 1:].contiguous(), c.cand_logits[:, 1:].contiguous(), c.embed,
                    ids.to(id_dtype), c.corrector)
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


def draw_labels(cand_ids: torch.Tensor, g: torch.Generator, absent: float = 0.25, invalid: float = 0.2):
    """(target, valid) for correction_loss: targets drawn from the candidates, some outside the top-K, and a
    validity mask with holes."""
    R, B, K = cand_ids.shape
    target = cand_ids.long().gather(2, torch.randint(0, K, (R, B, 1), generator=g))[..., 0]
    target = torch.where(torch.rand(R, B, generator=g) < absent, 10_000, target)
    return target, torch.rand(R, B, generator=g) >= invalid


def check_against_literal(case: Case, tol: float = 1e-5, same_walk: bool = True) -> torch.Tensor:
    """score, walk_inputs and the greedy forward of case, on its device, against the float64 literal: what ranks
    slot 1 (the drafter's logits, or S_0) and the grid within tol of the scores' scale, the walk within 10 tol of
    each row's best, the tokens exact; same_walk: the ranks are select's greedy walk of the scores score returned
    (on a CPU, where score and the fused walk round alike). Returns the ranks."""
    first64, grid64 = case.ref_first().cpu(), case.ref_scores().cpu()
    scale = max(first64.abs().max().item(), grid64.abs().max().item() if grid64.numel() else 0.0) + 1.0
    m = case.corrector
    with torch.no_grad():  # the native backend gathers a prepared table only without gradients
        first, grid = m.walk_inputs(m.score(*case.inputs, **case.kw), case.cand_logits)
    assert grid.dtype == torch.float32 and not grid.isnan().any()
    torch.testing.assert_close(first.double().cpu(), first64, rtol=tol, atol=2 * tol * scale)
    torch.testing.assert_close(grid.double().cpu(), grid64, rtol=tol, atol=2 * tol * scale)
    ranks, tokens = m(*case.inputs, **case.kw)
    assert ranks.shape == tokens.shape == case.cand_ids.shape[:2] and ranks.dtype == tokens.dtype == torch.int64
    assert_walk_matches(*case.core_walk(ranks.cpu(), first64, grid64), atol=10 * tol * scale)
    assert torch.equal(tokens, case.cand_ids.long().gather(2, ranks[..., None])[..., 0])
    if same_walk:
        assert torch.equal(ranks, dcoco.select(grid, first, "greedy"))
    return ranks


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
