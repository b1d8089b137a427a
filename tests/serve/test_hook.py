"""The vLLM hook's tensor work (dcoco.serve.hook) without vLLM: the top-K's rank 0 is the drafter's own argmax however
the logits tie, so a corrector at initialisation drafts exactly what DFlash drafts, and the hand-back writes only
the choice."""

import pytest
import torch

from dcoco import Corrector
from dcoco.serve import hook


def _tied_logits(rows: int, V: int, dtype: torch.dtype, seed: int, most: int = 16) -> torch.Tensor:
    """Logits on a coarse grid (many exact ties below the maximum), the maximum shared by up to `most` entries."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (rows, V), generator=g).to(dtype)
    for r in range(rows):
        x[r, torch.randperm(V, generator=g)[:1 + r % most]] = 9  # 1 to `most` tied maxima, at random places
    if most > 1:
        x[0, 5] = x[0, V - 5] = 9  # two more, far apart
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("k", [1, 4, 16])
def test_rank_zero_is_the_argmax_under_ties(dtype, k):
    logits = _tied_logits(64, 512, dtype, seed=k, most=k)
    assert (logits == logits.amax(-1, keepdim=True)).sum(-1).max() == k  # rows with 1 to k tied maxima
    ids, values = hook.candidates(logits.clone(), k)
    assert ids.shape == values.shape == (64, k) and values.dtype == torch.float32
    assert torch.equal(ids[:, 0], logits.argmax(-1))  # the first maximum, as DFlash drafts it (<= k ties)
    assert torch.equal(values, logits.topk(k, dim=-1).values.float())  # the top-K values, in order
    assert torch.equal(logits.gather(1, ids).float(), values)  # each id carries its own logit
    assert all(len(set(r)) == k for r in ids.tolist())  # no id twice


@pytest.mark.parametrize("point_mass", [False, True])
@pytest.mark.parametrize("selection", ["greedy", "global", "geometric"])
def test_a_corrector_at_initialisation_drafts_what_dflash_drafts(selection, point_mass):
    R, N, K, d, V = 3, 5, 8, 64, 512
    g = torch.Generator().manual_seed(7)
    m = Corrector(d, num_candidates=K, width=16, mlp_hidden=32)  # its output layer starts at zero: Delta = 0
    embed = torch.randn(V, d, generator=g)
    m.prepare_inference(embed)
    hidden = torch.randn(R * N, d, generator=g)
    logits = _tied_logits(R * N, V, torch.bfloat16, seed=3, most=K)
    want = logits.argmax(-1)
    correct = hook.rows(lambda h, i, lg: hook.tokens(m, embed, selection, h, i, lg), N)
    out = hook.on_logits(correct, hidden, logits.clone(), K, point_mass)
    assert torch.equal(out.argmax(-1), want)
    finite = torch.isfinite(out).sum(-1)
    assert (finite == 1).all() if point_mass else (finite == V - 1).all()  # 0 there, or +inf there


def test_the_hand_back_writes_the_choice_only():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([3, 0, 39, 7, 7, 12])
    marked = hook.hand_back(logits.clone(), tokens, point_mass=False)
    assert torch.equal(marked.argmax(-1), tokens) and int((marked != logits).sum()) == 6
    mass = hook.hand_back(logits.clone(), tokens, point_mass=True)
    assert torch.equal(mass.softmax(-1), torch.nn.functional.one_hot(tokens, 40).float())
