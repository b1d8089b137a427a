"""The vLLM hook's tensor work (dcoco.serve.hook) without vLLM: the top-K's rank 0 is the drafter's own argmax however
the logits tie, so a corrector at initialisation drafts exactly what DFlash drafts, and the hand-back writes only
the choice."""

import pytest
import torch

from dcoco import Corrector
from dcoco.ops.select import select
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


def _anchor_case(R=4, N=5, K=8, d=64, V=512, seed=11):
    """An anchor-aware corrector with a nonzero output layer (it re-ranks slot 1), prepared, and one draft call's
    rows as vLLM hands them: drafted rows (R*N, d) request-major, the anchors' rows (R, d) and tokens (R,)."""
    g = torch.Generator().manual_seed(seed)
    m = Corrector(d, num_candidates=K, width=16, mlp_hidden=32, anchor_transition=True)
    torch.nn.init.normal_(m.mlp[2].weight, std=3.0, generator=g)
    embed = torch.randn(V, d, generator=g)
    m.prepare_inference(embed)
    return (m, embed, torch.randn(R * N, d, generator=g), torch.randn(R, d, generator=g),
            torch.randint(0, V, (R,), generator=g, dtype=torch.int32), torch.randn(R * N, V, generator=g))


@pytest.mark.parametrize("selection", ["greedy", "global", "geometric"])
def test_the_anchor_hook_is_the_correctors_call_on_request_major_rows(selection):
    """hook.rows with anchors: each request's block is its anchor row then its N drafted rows, and the tokens are
    those of Corrector (forward, or score + walk_inputs + select) on exactly those inputs."""
    m, embed, hidden, anchor_hidden, anchor_ids, logits = _anchor_case()
    R, N, K = anchor_ids.shape[0], hidden.shape[0] // anchor_ids.shape[0], m.num_candidates
    correct = hook.rows(lambda h, i, lg, a: hook.tokens(m, embed, selection, h, i, lg, a), N)
    out = hook.on_logits(correct, hidden, logits.clone(), K, False, anchor_hidden, anchor_ids)
    ids, values = hook.candidates(logits.clone(), K)
    blocks = torch.cat([anchor_hidden[:, None], hidden.view(R, N, -1)], 1)  # (R, N+1, d), the anchor first
    if selection == "greedy":
        want = m(blocks, ids.view(R, N, K), values.view(R, N, K), embed, anchor_ids)[1]
    else:
        scores = m.score(blocks, ids.view(R, N, K), values.view(R, N, K), embed, anchor_ids)
        first, grid = m.walk_inputs(scores, values.view(R, N, K))
        want = ids.view(R, N, K).gather(2, select(grid, first, selection)[..., None])[..., 0]
    assert torch.equal(out.argmax(-1), want.reshape(-1))
    assert bool((want[:, 0] != ids.view(R, N, K)[:, 0, 0]).any())  # the anchor term re-ranked slot 1 somewhere


def test_the_anchor_is_read_per_request():
    """Changing one request's anchor (its row or its token) can change that request's draft only."""
    m, embed, hidden, anchor_hidden, anchor_ids, logits = _anchor_case(R=6)
    R, K = anchor_ids.shape[0], m.num_candidates
    N = hidden.shape[0] // R
    correct = hook.rows(lambda h, i, lg, a: hook.tokens(m, embed, "greedy", h, i, lg, a), N)
    ids, values = hook.candidates(logits, K)
    base = correct(hidden, ids, values, anchor_hidden, anchor_ids).view(R, N)
    other_h, other_ids = anchor_hidden.clone(), anchor_ids.clone()
    other_h[2] = -other_h[2]
    other_ids[4] = (other_ids[4] + 1) % embed.shape[0]
    moved = correct(hidden, ids, values, other_h, other_ids).view(R, N)
    keep = [r for r in range(R) if r not in (2, 4)]
    assert torch.equal(moved[keep], base[keep])


def test_the_anchor_hook_sampled_walk_at_temperature_zero_is_the_greedy_walk():
    m, embed, hidden, anchor_hidden, anchor_ids, logits = _anchor_case()
    R, K = anchor_ids.shape[0], m.num_candidates
    N = hidden.shape[0] // R
    ids, values = hook.candidates(logits, K)
    blocks = hook.blocks(hidden, N, anchor_hidden)
    tokens, q = hook.sampled(m, embed, blocks, ids.view(R, N, K), values.view(R, N, K), torch.zeros(R), anchor_ids)
    assert torch.equal(tokens, hook.tokens(m, embed, "greedy", blocks, ids.view(R, N, K), values.view(R, N, K),
                                           anchor_ids))
    assert q.shape == (R, N, K) and torch.equal(q.sum(-1), torch.ones(R, N))


def test_the_anchor_arguments_are_checked_by_name():
    m, embed, hidden, anchor_hidden, anchor_ids, logits = _anchor_case()
    N = hidden.shape[0] // anchor_ids.shape[0]
    correct = hook.rows(lambda *a: hook.tokens(m, embed, "greedy", *a), N)
    ids, values = hook.candidates(logits, m.num_candidates)
    with pytest.raises(ValueError, match="anchor_hidden, anchor_ids"):
        correct(hidden, ids, values, anchor_hidden)
    with pytest.raises(ValueError, match="anchor_hidden"):
        correct(hidden, ids, values, anchor_hidden[:-1], anchor_ids)
    with pytest.raises(ValueError, match="anchor_ids"):  # the Corrector's own check: an anchor-aware one needs them
        correct(hidden, ids, values)
