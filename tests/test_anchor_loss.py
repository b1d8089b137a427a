"""Training with the anchor transition: correction_loss's p = 0 term against a literal float64 computation (its mask
m_0 and its share of Z), and the gradients of score + walk_inputs + the loss in every input, the anchor's hidden
state included: gradcheck in float64 on both backends, and the float32 backward (the fused backend's compiled one,
autograd on the native one) against autograd through the literal reference."""

import math

import pytest
import torch
from torch import nn

import dcoco
from dcoco.loss import correction_loss
from dcoco.ops import fused

from helpers.anchor import make_anchor_case

pytestmark = pytest.mark.usefixtures("each_backend")  # every test on both backends

PARAMS = ("cand_proj.weight", "ctx_proj.weight", "fuse_proj.weight", "fuse_norm.weight", "fuse_norm.bias",
          "pair_proj.weight", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias")  # fused.WEIGHTS' order


def literal_loss(first, grid, cand_ids, target, valid, rho):
    """L_corr with the anchor term, written out: loops over blocks and slots in float64."""
    R, T, K, _ = grid.shape
    total, Z = 0.0, 0.0
    for q in range(R):
        rank = [next((k for k in range(K) if int(cand_ids[q, j, k]) == int(target[q, j])), None) for j in range(T + 1)]
        ok = [rank[j] is not None and bool(valid[q, j]) for j in range(T + 1)]
        if ok[0]:  # p = 0: w_0 = 1, a softmax over slot 1's K candidates
            row = [float(x) for x in first[q]]
            total += row[rank[0]] - math.log(sum(math.exp(x) for x in row))
            Z += 1.0
        for p in range(T):  # p + 1 = 1..B-1: the paper's terms
            if ok[p] and ok[p + 1]:
                w = math.exp(-p / rho)
                cells = [float(x) for x in grid[q, p].reshape(-1)]
                total += w * (cells[rank[p] * K + rank[p + 1]] - math.log(sum(math.exp(x) for x in cells)))
                Z += w
    return -total / max(1.0, Z)


def labels(cand_ids, g, absent=0.25, invalid=0.2):
    """Targets drawn from the candidates, some outside the top-K, and a validity mask with holes."""
    R, B, K = cand_ids.shape
    target = cand_ids.long().gather(2, torch.randint(0, K, (R, B, 1), generator=g))[..., 0]
    target = torch.where(torch.rand(R, B, generator=g) < absent, 10_000, target)
    return target, torch.rand(R, B, generator=g) >= invalid


@pytest.mark.parametrize("R,B,K,rho", [(6, 5, 4, 4.0), (3, 15, 16, 2.5), (8, 2, 1, 4.0), (1, 15, 16, 4.0)])
def test_the_anchor_term_against_the_literal(R, B, K, rho):
    g = torch.Generator().manual_seed(R + B + K)
    first, grid = torch.randn(R, K, generator=g) * 2, torch.randn(R, B - 1, K, K, generator=g) * 2
    cand_ids = torch.stack([torch.randperm(300, generator=g)[:K] for _ in range(R * B)]).view(R, B, K)
    target, valid = labels(cand_ids, g)
    got = correction_loss(grid.double(), cand_ids, target, valid, rho, anchor_scores=first.double())
    assert got.dtype == torch.float64
    want = literal_loss(first.double(), grid.double(), cand_ids, target, valid, rho)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)
    in32 = correction_loss(grid, cand_ids, target, valid, rho, anchor_scores=first.bfloat16())
    assert in32.dtype == torch.float32  # float32 at least, whatever the anchor scores' dtype
    want16 = literal_loss(first.bfloat16().double(), grid.double(), cand_ids, target, valid, rho)
    assert in32.item() == pytest.approx(want16, rel=1e-5, abs=1e-6)


def test_m0_masks_and_z_counts_the_anchor_term():
    """Slot 1 invalid or its label absent drops the term (slot 2 does not matter to it); a kept term adds w_0 = 1
    to Z, so one transition (w_1 = 1) and the anchor term average over Z = 2, not 1."""
    g = torch.Generator().manual_seed(3)
    first, grid = torch.randn(1, 3, generator=g).double(), torch.randn(1, 1, 3, 3, generator=g).double()
    cand = torch.tensor([[[4, 5, 6], [7, 8, 9]]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    logp0 = torch.log_softmax(first[0], 0)[2].item()
    logp1 = torch.log_softmax(grid[0, 0].reshape(-1), 0)[2 * 3 + 1].item()
    loss = lambda t, v: correction_loss(grid, cand, torch.tensor([t]), v, anchor_scores=first).item()
    assert loss([6, 8], valid) == pytest.approx(-(logp0 + logp1) / 2, rel=1e-12)
    assert loss([6, 99], valid) == pytest.approx(-logp0, rel=1e-12)  # slot 2 absent: the anchor term alone, Z = 1
    assert loss([99, 8], valid) == 0.0  # slot 1 absent: nothing supervised
    assert loss([6, 8], torch.tensor([[False, True]])) == 0.0  # slot 1 invalid
    assert loss([6, 8], torch.tensor([[True, False]])) == pytest.approx(-logp0, rel=1e-12)
    assert correction_loss(grid, cand, torch.tensor([[6, 8]]), valid).item() == pytest.approx(-logp1, rel=1e-12)
    # the first match of a repeated label, as for the transitions
    rep = torch.tensor([[[4, 6, 6], [7, 8, 9]]])
    want = -torch.log_softmax(first[0], 0)[1].item()
    assert correction_loss(grid, rep, torch.tensor([[6, 99]]), valid, anchor_scores=first).item() == pytest.approx(want)


class Step(nn.Module):
    """score + walk_inputs + correction_loss(anchor_scores=first): what training runs, as a function of the inputs
    and of the corrector's parameters (torch.func.functional_call substitutes them)."""

    def __init__(self, case, target, valid):
        super().__init__()
        self.m, self.case, self.target, self.valid = case.corrector, case, target, valid

    def forward(self, hidden, logits):
        c = self.case
        scores = self.m.score(hidden, c.cand_ids, logits, c.embed, anchor_ids=c.anchor_ids)
        first, grid = self.m.walk_inputs(scores, logits)
        return first, grid, correction_loss(grid, c.cand_ids, self.target, self.valid, anchor_scores=first)


@pytest.mark.parametrize("R,B,K,d,fast", [(1, 2, 1, 3, False), (2, 4, 3, 8, True), (3, 3, 5, 6, True)])
def test_gradcheck_float64(R, B, K, d, fast):
    c = make_anchor_case(R, B, K, d, V=4 * K + 7, seed=R + B + K, r=4, H=5)
    c.corrector.double()
    target, valid = labels(c.cand_ids, torch.Generator().manual_seed(1), absent=0.1, invalid=0.1)
    step = Step(c, target, valid)
    c.embed = c.embed.double()
    hidden = c.hidden.double().requires_grad_()
    logits = c.cand_logits.double().requires_grad_()
    weights = [w.detach().clone().requires_grad_() for w in c.corrector.weights()]

    def f(h, lg, *ws):
        return torch.func.functional_call(step, {f"m.{n}": w for n, w in zip(PARAMS, ws)}, (h, lg))

    first, _, loss = f(hidden, logits, *weights)
    assert first.dtype == torch.float64 and (loss.item() != 0.0 or K == 1)  # supervised (K = 1: log 1 = 0)
    assert torch.autograd.gradcheck(f, (hidden, logits, *weights), eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=fast)
    assert (torch.autograd.grad(f(hidden, logits, *weights)[0].sum(), hidden)[0][:, 0] != 0).any()  # h_0 counts


def reference_grads(c, G0, G, target, valid):
    """Gradients of sum(S_0 G0) + sum(grid G) + the loss by autograd through the literal reference, in float64."""
    from dcoco.testing import reference as ref

    h = c.hidden.double().requires_grad_()
    lg = c.cand_logits.double().requires_grad_()
    ws = [w.detach().double().requires_grad_() for w in c.corrector.weights()]
    first = ref.anchor_scores(h, c.cand_ids, lg, c.anchor_ids, c.embed.double(), *ws)
    grid = ref.score(h[:, 1:], c.cand_ids, lg, c.embed.double(), *ws)
    ((first * G0).sum() + (grid * G).sum() + correction_loss(grid, c.cand_ids, target, valid, anchor_scores=first)
     ).backward()
    return [h.grad, lg.grad, *(w.grad for w in ws)]


@pytest.mark.parametrize("R,B,K,d,dtype", [(1, 15, 16, 64, torch.float32), (3, 2, 1, 96, torch.float32),
                                           (2, 5, 4, 256, torch.bfloat16), (2, 4, 16, 64, torch.float16)])
def test_float32_grads_match_autograd_through_the_reference(R, B, K, d, dtype):
    c = make_anchor_case(R, B, K, d, dtype=dtype, seed=R + B + d)
    g = torch.Generator().manual_seed(2)
    G0, G = torch.randn(R, K, generator=g), torch.randn(R, B - 1, K, K, generator=g)
    target, valid = labels(c.cand_ids, g)
    h = c.hidden.clone().requires_grad_()
    lg = c.cand_logits.clone().requires_grad_()
    first, grid, loss = Step(c, target, valid)(h, lg)
    ((first * G0).sum() + (grid * G).sum() + loss).backward()
    ours = [h.grad, lg.grad, *(w.grad for w in c.corrector.weights())]
    for name, got, want in zip(("hidden", "cand_logits", *fused.WEIGHTS), ours, reference_grads(c, G0, G, target,
                                                                                              valid)):
        assert got.dtype == (dtype if name in ("hidden", "cand_logits") else torch.float32), name
        scale = want.abs().max().item() + 1e-30
        tol = 1e-2 if got.dtype != torch.float32 else 2e-5  # 16-bit grads are rounded to their dtype
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * scale, msg=name)
    assert (h.grad[:, 0] != 0).any()  # the anchor's hidden state gets its gradient


@pytest.mark.fused_only  # compares the two backends itself
@pytest.mark.parametrize("R,B,K,d", [(2, 15, 16, 64), (4, 3, 5, 128)])
def test_the_compiled_backward_agrees_with_native_autograd(R, B, K, d):
    c = make_anchor_case(R, B, K, d, seed=R * B + d)
    g = torch.Generator().manual_seed(4)
    G0, G = torch.randn(R, K, generator=g), torch.randn(R, B - 1, K, K, generator=g)
    target, valid = labels(c.cand_ids, g)
    grads = {}
    for name in ("fused", "native"):
        with dcoco.use_backend(name):
            c.corrector.zero_grad()
            h = c.hidden.clone().requires_grad_()
            lg = c.cand_logits.clone().requires_grad_()
            first, grid, loss = Step(c, target, valid)(h, lg)
            ((first * G0).sum() + (grid * G).sum() + loss).backward()
            grads[name] = [h.grad, lg.grad, *(w.grad.clone() for w in c.corrector.weights())]
    for name, got, want in zip(("hidden", "cand_logits", *fused.WEIGHTS), grads["fused"], grads["native"]):
        scale = want.abs().max().item() + 1e-30
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5 * scale, msg=name)
