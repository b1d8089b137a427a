"""correction_loss (docs/spec.md, "Training"; the paper's eq. 9, and the anchor transition's p = 0 term):
hand-computed values, weights and Z, label dropping, a literal float64 loop on random grids, named errors. Its
gradients, through score and walk_inputs: tests/ops/test_grad.py."""

from __future__ import annotations

import math

import pytest
import torch

from dcoco.loss import correction_loss

from helpers.cases import draw_labels


def lse(*xs: float) -> float:
    return math.log(sum(math.exp(x) for x in xs))


def test_one_transition_by_hand():
    # K=2, B=2: one transition; labels at ranks a*=1 (token 7), b*=0 (token 5)
    scores = torch.tensor([[[[0.0, 1.0], [2.0, 0.5]]]])
    cand = torch.tensor([[[3, 7], [5, 9]]])
    target = torch.tensor([[7, 5]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    expected = -(2.0 - lse(0.0, 1.0, 2.0, 0.5))  # w_1 = 1, Z = max(1, 1) = 1
    assert correction_loss(scores, cand, target, valid).item() == pytest.approx(expected, rel=1e-6)


def test_weights_and_z_over_the_batch():
    # two rows, B=3, K=2: four supervised transitions with weights w_1, w_2
    s = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 3.0]]],
                      [[[0.0, 2.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 0.0]]]])     # (2,2,2,2)
    cand = torch.tensor([[[0, 1], [0, 1], [0, 1]], [[0, 1], [0, 1], [0, 1]]])
    target = torch.tensor([[0, 0, 1], [0, 1, 0]])
    valid = torch.ones(2, 3, dtype=torch.bool)
    rho = 2.0
    w1, w2 = 1.0, math.exp(-1 / rho)
    l00 = 1.0 - lse(1, 0, 0, 0)     # row 0, p=1: (a,b) = (0,0)
    l01 = 0.0 - lse(0, 0, 0, 3)     # row 0, p=2: (0,1)
    l10 = 2.0 - lse(0, 2, 0, 0)     # row 1, p=1: (0,1)
    l11 = 1.0 - lse(0, 0, 1, 0)     # row 1, p=2: (1,0)
    Z = 2 * (w1 + w2)               # > 1: one weighted mean over all four transitions
    expected = -(w1 * l00 + w2 * l01 + w1 * l10 + w2 * l11) / Z
    assert correction_loss(s, cand, target, valid, rho=rho).item() == pytest.approx(expected, rel=1e-6)
    # not a mean of per-block means: drop row 1's second transition (target outside the top-K)
    target2 = target.clone()
    target2[1, 2] = 9
    expected2 = -(w1 * l00 + w2 * l01 + w1 * l10) / (2 * w1 + w2)
    assert correction_loss(s, cand, target2, valid, rho=rho).item() == pytest.approx(expected2, rel=1e-6)


def test_z_clamped_at_one():
    # only the last transition of B=4 supervised: w_3 = exp(-2/4) < 1, so Z = 1 and L = -w_3 * logp
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(1, 3, 2, 2, generator=g)
    cand = torch.tensor([[[0, 1]] * 4])
    target = torch.tensor([[5, 5, 1, 0]])     # slots 1,2 not in the top-K: p = 1, 2 dropped
    valid = torch.ones(1, 4, dtype=torch.bool)
    logp = torch.log_softmax(scores[0, 2].reshape(-1), 0)[1 * 2 + 0]
    expected = -math.exp(-2 / 4) * logp.item()
    assert correction_loss(scores, cand, target, valid).item() == pytest.approx(expected, rel=1e-6)


def test_first_match_is_the_label():
    scores = torch.tensor([[[[0.0, 1.0], [2.0, 3.0]]]])
    cand = torch.tensor([[[4, 4], [6, 6]]])   # duplicates: the first match (rank 0) counts
    target = torch.tensor([[4, 6]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    expected = -(0.0 - lse(0, 1, 2, 3))
    assert correction_loss(scores, cand, target, valid).item() == pytest.approx(expected, rel=1e-6)


def test_invalid_slots_dropped():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(1, 3, 3, 3, generator=g)
    cand = torch.arange(12).view(1, 4, 3)
    target = cand[:, :, 0].clone()
    valid = torch.tensor([[True, True, False, True]])   # only p=1 (slots 1,2) survives
    expected = -torch.log_softmax(scores[0, 0].reshape(-1), 0)[0].item()
    assert correction_loss(scores, cand, target, valid).item() == pytest.approx(expected, rel=1e-6)


def test_no_supervised_transition():
    scores = torch.randn(2, 3, 4, 4, requires_grad=True)
    cand = torch.arange(32).view(2, 4, 4)
    target = torch.full((2, 4), 99)   # never in the top-K
    valid = torch.ones(2, 4, dtype=torch.bool)
    loss = correction_loss(scores, cand, target, valid)
    assert loss.item() == 0.0 and torch.isfinite(loss)
    loss.backward()
    assert torch.equal(scores.grad, torch.zeros_like(scores))
    # all valid=False too
    assert correction_loss(scores, cand, cand[:, :, 0], torch.zeros(2, 4, dtype=torch.bool)).item() == 0.0


def test_dropped_minus_inf_stays_finite():
    scores = torch.zeros(1, 2, 2, 2)
    scores[0, 1] = float("-inf")   # a fully masked grid at a dropped transition
    cand = torch.tensor([[[0, 1]] * 3])
    target = torch.tensor([[0, 1, 7]])
    loss = correction_loss(scores, cand, target, torch.ones(1, 3, dtype=torch.bool))
    assert loss.item() == pytest.approx(math.log(4), rel=1e-6)


def literal_loss(first, grid, cand_ids, target, valid, rho):
    """L_corr written out, loops over blocks and slots in float64; first: the anchor term's S_0, or None."""
    R, T, K, _ = grid.shape
    total, Z = 0.0, 0.0
    for q in range(R):
        rank = [next((k for k in range(K) if int(cand_ids[q, j, k]) == int(target[q, j])), None) for j in range(T + 1)]
        ok = [rank[j] is not None and bool(valid[q, j]) for j in range(T + 1)]
        if first is not None and ok[0]:  # p = 0: w_0 = 1, a softmax over slot 1's K candidates
            total += float(first[q, rank[0]]) - lse(*(float(x) for x in first[q]))
            Z += 1.0
        for p in range(T):  # p + 1 = 1..B-1: the paper's terms
            if ok[p] and ok[p + 1]:
                w = math.exp(-p / rho)
                cells = [float(x) for x in grid[q, p].reshape(-1)]
                total += w * (cells[rank[p] * K + rank[p + 1]] - lse(*cells))
                Z += w
    return -total / max(1.0, Z)


@pytest.mark.parametrize("anchor", [False, True], ids=["paper", "anchor"])
@pytest.mark.parametrize("R,B,K,rho", [(6, 5, 4, 4.0), (3, 15, 16, 2.5), (8, 2, 1, 4.0), (1, 15, 16, 4.0)])
def test_random_grids_against_the_literal(R, B, K, rho, anchor):
    g = torch.Generator().manual_seed(R + B + K)
    first, grid = torch.randn(R, K, generator=g) * 2, torch.randn(R, B - 1, K, K, generator=g) * 2
    cand_ids = torch.stack([torch.randperm(300, generator=g)[:K] for _ in range(R * B)]).view(R, B, K)
    target, valid = draw_labels(cand_ids, g)
    got = correction_loss(grid.double(), cand_ids, target, valid, rho,
                          anchor_scores=first.double() if anchor else None)
    assert got.dtype == torch.float64
    want = literal_loss(first.double() if anchor else None, grid.double(), cand_ids, target, valid, rho)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)
    if anchor:
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

    def loss(t, v):
        return correction_loss(grid, cand, torch.tensor([t]), v, anchor_scores=first).item()

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


def test_dtype_promotion():
    scores = torch.randn(1, 1, 2, 2)
    args = (torch.tensor([[[0, 1], [0, 1]]]), torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.bool))
    assert correction_loss(scores.bfloat16(), *args).dtype == torch.float32
    assert correction_loss(scores.double(), *args).dtype == torch.float64


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(scores=torch.zeros(1, 1, 2, 2, dtype=torch.long)), TypeError, "scores"),
    (dict(scores=torch.zeros(1, 2, 2)), ValueError, "scores"),
    (dict(scores=torch.zeros(1, 1, 2, 3)), ValueError, "scores"),
    (dict(cand_ids=torch.zeros(1, 2, 2)), TypeError, "cand_ids"),
    (dict(cand_ids=torch.zeros(1, 3, 2, dtype=torch.long)), ValueError, "cand_ids"),
    (dict(target_ids=torch.zeros(1, 3, dtype=torch.long)), ValueError, "target_ids"),
    (dict(target_ids=[[0, 1]]), TypeError, "target_ids"),
    (dict(valid=torch.ones(1, 2)), TypeError, "valid"),
    (dict(valid=torch.ones(2, 2, dtype=torch.bool)), ValueError, "valid"),
    (dict(rho=0.0), ValueError, "rho"),
    (dict(rho=float("nan")), ValueError, "rho"),
    (dict(anchor_scores=torch.randn(1, 3)), ValueError, r"anchor_scores: expected shape \(1, 2\)"),
    (dict(anchor_scores=torch.randn(2, 2)), ValueError, r"anchor_scores: expected shape \(1, 2\)"),
    (dict(anchor_scores=torch.randn(1, 2, 1)), ValueError, "anchor_scores: expected 2 dimensions"),
    (dict(anchor_scores=torch.randn(1, 2, device="meta")), ValueError, "anchor_scores: expected .* on cpu"),
    (dict(anchor_scores=torch.zeros(1, 2, dtype=torch.int64)), TypeError, "anchor_scores: expected"),
    (dict(anchor_scores=[[0.0, 0.0]]), TypeError, "anchor_scores: expected a torch.Tensor"),
])
def test_argument_errors(kwargs, exc, name):
    args = dict(scores=torch.zeros(1, 1, 2, 2), cand_ids=torch.zeros(1, 2, 2, dtype=torch.long),
                target_ids=torch.zeros(1, 2, dtype=torch.long), valid=torch.ones(1, 2, dtype=torch.bool))
    args.update(kwargs)
    with pytest.raises(exc, match=name):
        correction_loss(**args)


def test_labels_are_never_narrowed():
    """int64 labels of id + 2^32 must not match id among int32 candidates."""
    R, B, K = 2, 4, 6
    ids = torch.arange(R * B * K, dtype=torch.int32).view(R, B, K)
    labels = ids[..., 2].long()
    scores = torch.randn(R, B - 1, K, K)
    valid = torch.ones(R, B, dtype=torch.bool)
    hit = correction_loss(scores, ids, labels, valid)
    miss = correction_loss(scores, ids, labels + 2 ** 32, valid)
    assert float(hit) > 0 and float(miss) == 0  # no label in the top-K: no term
