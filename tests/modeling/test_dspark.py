"""DSpark's Markov and confidence heads (dspark.py) against a literal per-slot loop in float64."""

from __future__ import annotations

import math

import pytest
import torch

from dcoco.modeling.dspark import LOSS_WEIGHTS, DSparkHead

D, V, RANK = 12, 40, 6


def _head(seed: int, dtype=torch.float32) -> DSparkHead:
    torch.manual_seed(seed)
    h = DSparkHead(D, V, rank=RANK)
    torch.nn.init.normal_(h.markov_w2.weight, std=0.8)
    torch.nn.init.normal_(h.confidence_proj.weight)
    return h.to(dtype)


def _markov(h: DSparkHead, prev: int):
    return h.markov_w2.weight.double() @ h.markov_w1.weight[prev].double()


def _conf(h: DSparkHead, z, prev: int) -> float:
    x = torch.cat([z.double(), h.markov_w1.weight[prev].double()])
    return float(torch.sigmoid(h.confidence_proj.weight[0].double() @ x))


def literal_draft(h: DSparkHead, hidden, U, anchor):
    R, B, _ = U.shape
    tokens, conf = torch.empty(R, B, dtype=torch.long), torch.empty(R, B, dtype=torch.float64)
    for r in range(R):
        prev = int(anchor[r])
        for k in range(B):
            conf[r, k] = _conf(h, hidden[r, k], prev)
            tokens[r, k] = prev = int((U[r, k].double() + _markov(h, prev)).argmax())
    return tokens, conf


def _inputs(R, B, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(R, B, D, generator=g).to(dtype), (3 * torch.randn(R, B, V, generator=g)).to(dtype),
            torch.randint(0, V, (R,), generator=g), torch.randint(0, V, (R, B), generator=g),
            (2 * torch.randn(R, B, V, generator=g)).to(dtype))


@pytest.mark.parametrize("R,B", [(1, 1), (3, 2), (4, 7)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_logits_confidence_and_drafts_match_the_literal_loop(R, B, dtype, tol):
    h = _head(R + B, dtype)
    hidden, U, anchor, targets, _ = _inputs(R, B, 10 * R + B, dtype)
    prev = torch.cat([anchor[:, None], targets[:, :-1]], 1)
    got = torch.full((R, B, V), float("nan"))
    got.copy_(h.logits(U, prev))
    want = torch.stack([torch.stack([U[r, k].double() + _markov(h, int(prev[r, k])) for k in range(B)])
                        for r in range(R)])
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())
    c = h.confidence(hidden, prev)
    torch.testing.assert_close(c.double(), torch.tensor([[_conf(h, hidden[r, k], int(prev[r, k])) for k in range(B)]
                                                         for r in range(R)], dtype=torch.float64), rtol=tol, atol=tol)
    if dtype == torch.float32:
        tokens, conf = h(hidden, U, anchor)
        want_tokens, want_conf = literal_draft(h, hidden, U, anchor)
        assert torch.equal(tokens, want_tokens)
        torch.testing.assert_close(conf.double(), want_conf, rtol=1e-5, atol=1e-6)


def test_a_fresh_head_drafts_the_backbones_argmax():
    hidden, U, anchor, _, _ = _inputs(3, 5, 1)
    assert torch.equal(DSparkHead(D, V, RANK)(hidden, U, anchor)[0], U.argmax(-1))


@pytest.mark.parametrize("point_mass", [False, True])
def test_the_loss_is_the_weighted_sum_of_its_three_terms(point_mass):
    """With the target's logits, and without (p_t the point mass at the target's token)."""
    R, B, gamma = 3, 4, 5.0
    h = _head(4)
    hidden, U, anchor, targets, target_logits = _inputs(R, B, 9)
    valid = torch.rand(R, B, generator=torch.Generator().manual_seed(3)) > 0.3
    loss, picks = h.loss(hidden, U, anchor, targets, valid, None if point_mass else target_logits, gamma)
    a, b, c = LOSS_WEIGHTS
    num = den = 0.0
    with torch.no_grad():
        for r in range(R):
            prev = int(anchor[r])
            for k in range(B):
                x = U[r, k].double() + _markov(h, prev)
                assert int(picks[r, k]) == int(x.argmax())  # teacher-forced picks
                p_d = x.softmax(-1)
                if point_mass:
                    p_t = torch.zeros(V, dtype=torch.float64)
                    p_t[targets[r, k]] = 1
                else:
                    p_t = target_logits[r, k].double().softmax(-1)
                l1 = float((p_d - p_t).abs().sum())
                want, conf = 1 - l1 / 2, _conf(h, hidden[r, k], prev)
                bce = -(want * math.log(conf) + (1 - want) * math.log(1 - conf))
                if valid[r, k]:
                    w = math.exp(-k / gamma)
                    num += w * (a * float(-x.log_softmax(-1)[targets[r, k]]) + b * l1 + c * bce)
                    den += w
                prev = int(targets[r, k])
    assert math.isclose(loss.item(), num / den, rel_tol=1e-5)
    loss.backward()
    assert h.markov_w2.weight.grad.abs().max() > 0 and h.confidence_proj.weight.grad.abs().max() > 0


def test_bad_arguments_are_named():
    h = _head(0)
    hidden, U, anchor, targets, target_logits = _inputs(2, 3, 0)
    with pytest.raises(ValueError, match=r"base_logits, prev_ids: expected \(R,B,40\) and \(R,B\)"):
        h.logits(U[..., :5], targets)
    with pytest.raises(ValueError, match=r"target_logits: expected shape \(2, 3, 40\)"):
        h.loss(hidden, U, anchor, targets, torch.ones(2, 3, dtype=torch.bool), target_logits[:, :2])
    with pytest.raises(ValueError, match="rank: expected an integer >= 1"):
        DSparkHead(D, V, rank=0)
    assert h.flops(4) == {"grid": 2 * 4 * (V * RANK + D + RANK), "greedy": 2 * 4 * (V * RANK + D + RANK)}
