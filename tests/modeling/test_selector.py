"""The DFlash2 selector baseline (selector.py) against a literal per-slot loop, and the frozen-drafter training
every corrector and baseline head shares (frozen.py): on cached blocks whose right candidate is a function of its
predecessor, each learns to pick it."""

from __future__ import annotations

import pytest
import torch

from dcoco.train import frozen
from dcoco.corrector import Corrector
from dcoco.modeling.domino import DominoHead
from dcoco.modeling.dspark import DSparkHead
from dcoco.modeling.selector import CandidateSelector

R, B, K, V, D = 6, 5, 8, 50, 32


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(R * B)]).view(R, B, K)
    vals = torch.randn(R, B, K, generator=g).sort(-1, descending=True).values
    return torch.randn(R, B, D, generator=g), ids, vals, torch.randint(0, V, (R,), generator=g)


def literal_walk(s: CandidateSelector, h, ids, vals, anchor):
    out = torch.empty(R, B, dtype=torch.long)
    for r in range(R):
        prev = int(anchor[r])
        for t in range(B):
            g = (s.proj.weight @ h[r, t] * s.pred.weight[prev]).detach()
            scores = [float(vals[r, t, k]) + float(g @ s.succ.weight[ids[r, t, k]].detach()) for k in range(K)]
            out[r, t] = max(range(K), key=lambda k: scores[k])
            prev = int(ids[r, t, out[r, t]])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_walk_matches_literal_loop(seed):
    torch.manual_seed(seed)
    s = CandidateSelector(D, V, rank=4, num_candidates=K)
    torch.nn.init.normal_(s.succ.weight, std=3.0)
    h, ids, vals, anchor = inputs(seed + 10)
    ranks, tokens = s(h, ids, vals, anchor)
    assert torch.equal(ranks, literal_walk(s, h, ids, vals, anchor))
    assert torch.equal(tokens, ids.gather(2, ranks[..., None])[..., 0])
    assert (ranks[:, 0] != 0).any()  # slot 1 can move: its predecessor, the anchor, is known


def test_fresh_selector_keeps_the_argmax():
    h, ids, vals, anchor = inputs(3)
    ranks, _ = CandidateSelector(D, V, rank=4)(h, ids, vals, anchor)
    assert (ranks == 0).all()


def test_bad_shapes_name_the_arguments():
    h, ids, vals, anchor = inputs(4)
    with pytest.raises(ValueError, match="prev_ids"):
        CandidateSelector(D, V).score(h, ids, vals, anchor)
    with pytest.raises(ValueError, match="rank"):
        CandidateSelector(D, V, rank=0)


def chain_cache(n: int, seed: int) -> dict[str, torch.Tensor]:
    """Cached blocks whose verifier token at slot t is the candidate (id) that follows its predecessor in a fixed
    permutation of the vocabulary, placed at a random rank below the drafter's argmax."""
    g = torch.Generator().manual_seed(seed)
    nxt = torch.randperm(V, generator=torch.Generator().manual_seed(99))
    anchor = torch.randint(0, V, (n,), generator=g)
    ids = torch.empty(n, B, K, dtype=torch.long)
    target = torch.empty(n, B, dtype=torch.long)
    prev = anchor
    for t in range(B):
        target[:, t] = nxt[prev]
        others = torch.stack([torch.randperm(V, generator=g)[:K + 1] for _ in range(n)])
        others = torch.stack([o[o != tt][:K] for o, tt in zip(others, target[:, t])])
        pos = torch.randint(1, K, (n,), generator=g)
        others[torch.arange(n), pos] = target[:, t]
        ids[:, t] = others
        prev = target[:, t]
    vals = torch.randn(n, B, K, generator=g).sort(-1, descending=True).values
    hidden = 1 + 0.3 * torch.randn(n, B, D, generator=g)  # drafter states share a mean direction, as real ones do
    return {"hidden": hidden, "cand_ids": ids.int(), "cand_logits": vals,
            "anchor_ids": anchor, "target": target, "valid": torch.ones(n, B, dtype=torch.bool)}


def make(kind: str):
    return {"selector": lambda: CandidateSelector(D, V, rank=16, num_candidates=K),
            "corrector": lambda: Corrector(D, num_candidates=K, width=16, mlp_hidden=32),
            "domino": lambda: DominoHead(D, D, V, gru_size=32, mid_size=32),
            "dspark": lambda: DSparkHead(D, V, rank=16)}[kind]()


@pytest.mark.parametrize("kind", ["selector", "corrector", "domino", "dspark"])
def test_frozen_training_learns_transitions(kind):
    """The full-vocabulary heads read the drafter's logits U = hidden @ head.T, which here rank the chain's token
    nowhere in particular: what they learn comes from the predecessor."""
    torch.manual_seed(0)
    embed = torch.randn(V, D)
    head = torch.randn(V, D, generator=torch.Generator().manual_seed(7)) * D ** -0.5
    cache, test = chain_cache(2048, 0), chain_cache(256, 1)
    model = make(kind)
    with torch.no_grad():
        before = float(frozen.objective(model, test, embed, head, done=1.0))
    info = frozen.train(model, cache, embed, head, steps=150, batch=128, lr=3e-2, progress=False)
    with torch.no_grad():
        after = float(frozen.objective(model, test, embed, head, done=1.0))
    assert info["steps"] == 150 and info["final_loss"] < before and after < 0.5 * before
    U = test["hidden"] @ head.T
    if kind == "domino":  # slot 1 is U's alone (wrong here); given the chain's tokens, the GRU predicts the next
        prev = torch.cat([test["anchor_ids"][:, None], test["target"][:, :-1]], 1)
        tokens = model.logits(test["hidden"], U, prev, embed).argmax(-1)
        assert (tokens[:, 1:] == test["target"][:, 1:]).float().mean() > 0.9
    if kind == "dspark":
        tokens, _ = model(test["hidden"], U, test["anchor_ids"])
        assert (tokens == test["target"]).float().mean() > 0.9
    if kind == "selector":  # the walk now follows the chain from the anchor
        ranks, tokens = model(test["hidden"].float(), test["cand_ids"].long(), test["cand_logits"], test["anchor_ids"])
        assert (tokens == test["target"]).float().mean() > 0.9
