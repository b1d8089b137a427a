"""Domino's residual head (domino.py) against a literal per-slot loop: the GRU's equations written out, each
block and slot on its own, in float64."""

from __future__ import annotations

import math

import pytest
import torch

from dcoco.modeling.domino import DominoHead, curriculum

D, E_DIM, V = 12, 10, 40


def _head(seed: int, dtype=torch.float32) -> DominoHead:
    torch.manual_seed(seed)
    h = DominoHead(D, E_DIM, V, gru_size=8, mid_size=6)
    torch.nn.init.normal_(h.out.weight, std=0.7)
    torch.nn.init.normal_(h.out.bias, std=0.3)
    return h.to(dtype)


def _gru_step(h: DominoHead, x, s):
    """One step of a bias-free GRU, as written in its definition (reset, update, new gate)."""
    w_ih, w_hh = (getattr(h.gru, n).double() for n in ("weight_ih_l0", "weight_hh_l0"))
    G = h.gru_size
    gi, gh = w_ih @ x, w_hh @ s
    r = torch.sigmoid(gi[:G] + gh[:G])
    z = torch.sigmoid(gi[G:2 * G] + gh[G:2 * G])
    n = torch.tanh(gi[2 * G:] + r * gh[2 * G:])
    return (1 - z) * n + z * s


def _correction(h: DominoHead, z, s):
    m = h.mix.weight.double() @ torch.cat([z, s]) + h.mix.bias.double()
    return h.out.weight.double() @ (m * torch.sigmoid(m)) + h.out.bias.double()


def literal(h: DominoHead, hidden, U, prev, embed):
    """Logits (R,B,V) float64: slot 1 is U; slot n adds the correction after the GRU read prev[0..n-1]."""
    R, B, _ = U.shape
    out = U.double().clone()
    for r in range(R):
        s = torch.zeros(h.gru_size, dtype=torch.float64)
        for n in range(B):
            s = _gru_step(h, embed[prev[r, n]].double(), s)
            if n:
                out[r, n] += _correction(h, hidden[r, n].double(), s)
    return out


def literal_draft(h: DominoHead, hidden, U, anchor, embed):
    R, B, _ = U.shape
    tokens = torch.empty(R, B, dtype=torch.long)
    for r in range(R):
        s, prev = torch.zeros(h.gru_size, dtype=torch.float64), int(anchor[r])
        for n in range(B):
            s = _gru_step(h, embed[prev].double(), s)
            v = U[r, n].double() + (_correction(h, hidden[r, n].double(), s) if n else 0)
            tokens[r, n] = prev = int(v.argmax())
    return tokens


def _inputs(R, B, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(R, B, D, generator=g).to(dtype), (3 * torch.randn(R, B, V, generator=g)).to(dtype),
            torch.randint(0, V, (R,), generator=g), torch.randint(0, V, (R, B), generator=g),
            torch.randn(V, E_DIM, generator=g).to(dtype))


@pytest.mark.parametrize("R,B", [(1, 1), (3, 2), (4, 6), (2, 9)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 6e-2)])
def test_logits_and_drafts_match_the_literal_loop(R, B, dtype, tol):
    h = _head(R * 10 + B, dtype)
    hidden, U, anchor, targets, embed = _inputs(R, B, R + B, dtype)
    prev = torch.cat([anchor[:, None], targets[:, :-1]], 1)
    got = torch.full((R, B, V), float("nan"))
    got.copy_(h.logits(hidden, U, prev, embed))
    want = literal(h, hidden, U, prev, embed)
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())
    if dtype == torch.float32:  # bf16 rounding may flip near ties
        assert torch.equal(h(hidden, U, anchor, embed), literal_draft(h, hidden, U, anchor, embed))


def test_a_fresh_head_drafts_the_backbones_argmax():
    hidden, U, anchor, _, embed = _inputs(3, 5, 1)
    assert torch.equal(DominoHead(D, E_DIM, V, 8, 6)(hidden, U, anchor, embed), U.argmax(-1))


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_the_loss_is_the_curriculum_mix_of_both_cross_entropies(lam):
    R, B, gamma = 3, 5, 4.0
    h = _head(3)
    hidden, U, anchor, targets, embed = _inputs(R, B, 7)
    valid = torch.rand(R, B, generator=torch.Generator().manual_seed(2)) > 0.3
    loss, picks = h.loss(hidden, U, anchor, targets, valid, embed, lam, gamma)
    with torch.no_grad():
        final = literal(h, hidden, U, torch.cat([anchor[:, None], targets[:, :-1]], 1), embed)
    assert torch.equal(picks, final.argmax(-1))  # teacher-forced picks
    num = den = 0.0
    for r in range(R):
        for k in range(B):
            if valid[r, k]:
                w = math.exp(-k / gamma)
                ce = lambda x: float(-x.log_softmax(-1)[targets[r, k]])  # noqa: B023 (called in this iteration)
                num += w * ((1 - lam) * ce(final[r, k]) + lam * ce(U[r, k].double()))
                den += w
    assert math.isclose(loss.item(), num / den, rel_tol=1e-5)
    loss.backward()
    grad = h.out.weight.grad
    assert (grad.abs().max() == 0) == (lam == 1.0)  # lam = 1: the base alone, no signal for the head


def test_curriculum_goes_from_one_to_zero():
    assert [curriculum(s, 4) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_bad_arguments_are_named():
    h = _head(0)
    hidden, U, anchor, targets, embed = _inputs(2, 3, 0)
    with pytest.raises(ValueError, match="hidden, base_logits, prev_ids: expected"):
        h.logits(hidden[:, :2], U, targets, embed)
    with pytest.raises(TypeError, match="prev_ids: expected an integer tensor"):
        h.logits(hidden, U, targets.float(), embed)
    with pytest.raises(ValueError, match=r"lam: expected a number in \[0, 1\]"):
        h.loss(hidden, U, anchor, targets, torch.ones(2, 3, dtype=torch.bool), embed, 1.5)
    with pytest.raises(ValueError, match="gru_size: expected an integer >= 1"):
        DominoHead(D, E_DIM, V, gru_size=0)
    n = 2 * 3 * (3 * 8 * (E_DIM + 8) + 6 * (D + 8) + V * 6)
    assert h.flops(4) == {"grid": n, "greedy": n}
