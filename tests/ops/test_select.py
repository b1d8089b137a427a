"""The three selection rules against the brute force over all K^B paths (dcoco.testing.reference.best_path) and
the greedy literal loop; the sampled walk's law; ties, NaN and inf; named errors."""

import itertools
import math

import pytest
import torch

import dcoco
from dcoco.testing import reference as ref
from dcoco.ops.select import sample

pytestmark = pytest.mark.usefixtures("each_backend")  # every test on both backends


def path_value(scores, first, ranks, lam):
    R, T = scores.shape[:2]
    v = first.double().gather(1, ranks[:, :1])[:, 0]
    for p in range(T):
        v = v + lam ** p * scores[torch.arange(R), p, ranks[:, p], ranks[:, p + 1]].double()
    return v


@pytest.mark.parametrize("R,B,K", [(3, 2, 4), (4, 4, 3), (2, 6, 2), (2, 5, 3), (1, 3, 1)])
@pytest.mark.parametrize("rule,lam", [("global", 1.0), ("geometric", 0.75), ("geometric", 0.3)])
def test_path_rules_find_the_best_path(R, B, K, rule, lam):
    g = torch.Generator().manual_seed(R * 100 + B * 10 + K)
    scores = torch.randn(R, B - 1, K, K, generator=g)
    first = torch.randn(R, K, generator=g)
    ranks = dcoco.select(scores, first, rule, lam)
    best = ref.best_path(scores, first, 1.0 if rule == "global" else lam)
    # the same path, or (float rounding of a near tie) one of the same value
    same = (ranks == best).all(1)
    torch.testing.assert_close(path_value(scores, first, ranks, lam if rule == "geometric" else 1.0)[~same],
                               path_value(scores, first, best, lam if rule == "geometric" else 1.0)[~same])
    assert same.float().mean() >= 0.5


def test_global_beats_greedy_when_the_greedy_start_is_a_trap():
    # slot 1: rank 0 leads by 1, but every continuation of rank 0 is poor
    scores = torch.zeros(1, 1, 2, 2)
    scores[0, 0, 0] = torch.tensor([-5.0, -6.0])
    scores[0, 0, 1] = torch.tensor([3.0, 0.0])
    first = torch.tensor([[1.0, 0.0]])
    assert dcoco.select(scores, first, "greedy").tolist() == [[0, 0]]
    assert dcoco.select(scores, first, "global").tolist() == [[1, 0]]


def test_geometric_lambda_one_is_global():
    g = torch.Generator().manual_seed(3)
    scores, first = torch.randn(16, 14, 16, 16, generator=g), torch.randn(16, 16, generator=g)
    assert torch.equal(dcoco.select(scores, first, "geometric", 1.0), dcoco.select(scores, first, "global"))


def test_greedy_matches_the_literal_loop():
    g = torch.Generator().manual_seed(4)
    scores, first = torch.randn(8, 14, 16, 16, generator=g), torch.randn(8, 16, generator=g)
    assert torch.equal(dcoco.select(scores, first), ref.greedy(scores, first))


@pytest.mark.parametrize("rule", ["greedy", "global", "geometric"])
def test_ties_go_to_the_lower_rank(rule):
    # dyadic integers: every sum is exact, so the tie rule is all that decides
    g = torch.Generator().manual_seed(5)
    scores = torch.randint(-2, 3, (6, 3, 3, 3), generator=g).float()
    first = torch.randint(-1, 2, (6, 3), generator=g).float()
    ranks = dcoco.select(scores, first, rule, 0.5)
    if rule == "greedy":
        assert torch.equal(ranks, ref.greedy(scores, first))
    else:
        assert torch.equal(ranks, ref.best_path(scores, first, 1.0 if rule == "global" else 0.5))
    flat = dcoco.select(torch.zeros(2, 4, 5, 5), torch.zeros(2, 5), rule)
    assert torch.equal(flat, torch.zeros(2, 5, dtype=torch.int64))


@pytest.mark.parametrize("rule", ["greedy", "global", "geometric"])
def test_nan_never_wins(rule):
    scores = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(6))
    first = torch.tensor([[float("nan"), 0.5, 0.1, 0.2], [0.3, 0.2, 0.1, 0.0]])
    scores[:, :, :, 1] = float("nan")
    ranks = dcoco.select(scores, first, rule)
    assert ranks[0, 0] != 0
    assert (ranks[:, 1:] != 1).all()
    all_nan = dcoco.select(torch.full((1, 2, 3, 3), float("nan")), torch.full((1, 3), float("nan")), rule)
    assert torch.equal(all_nan, torch.zeros(1, 3, dtype=torch.int64))


def test_inf_logits_follow_ieee_order():
    scores = torch.zeros(1, 1, 3, 3)
    scores[0, 0, 0] = torch.tensor([float("-inf"), float("inf"), 0.0])
    first = torch.tensor([[0.0, float("-inf"), float("inf")]])
    assert dcoco.select(scores, first, "greedy").tolist() == [[2, 0]]


def test_first_logits_in_low_precision():
    g = torch.Generator().manual_seed(7)
    scores, first = torch.randn(4, 5, 8, 8, generator=g), torch.randn(4, 8, generator=g)
    for dt in (torch.bfloat16, torch.float16):
        assert torch.equal(dcoco.select(scores, first.to(dt), "global"),
                           dcoco.select(scores, first.to(dt).float(), "global"))


@pytest.mark.skipif(not dcoco.cuda_available(), reason="needs a CUDA device; none on this machine")
def test_select_on_cuda_matches_cpu_and_captures():
    g = torch.Generator().manual_seed(8)
    scores, first = torch.randn(64, 14, 16, 16, generator=g), torch.randn(64, 16, generator=g)
    for rule in ("greedy", "global", "geometric"):
        want = dcoco.select(scores, first, rule)
        got = dcoco.select(scores.cuda(), first.cuda(), rule)
        assert torch.equal(got.cpu(), want)
        graph = torch.cuda.CUDAGraph()
        s, f = scores.cuda(), first.cuda()
        with torch.cuda.graph(graph):
            out = dcoco.select(s, f, rule)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), want)


def test_sampled_walk_draws_each_path_with_its_probability():
    """select.sample: every path of a small grid drawn as often as the product of its slots' softmax(S / T), with
    q the distribution each drawn rank came from."""
    from scipy import stats

    K, B, T, n = 3, 3, 0.8, 60_000
    torch.manual_seed(3)
    scores, first = torch.randn(1, B - 1, K, K) * 1.5, torch.randn(1, K)
    ranks, q = sample(scores.expand(n, -1, -1, -1), first.expand(n, -1), T,
                                   torch.Generator().manual_seed(0))
    paths = list(itertools.product(range(K), repeat=B))
    exact = torch.tensor([math.prod([(first[0] / T).softmax(-1)[p[0]].item()] +
                                    [(scores[0, j, p[j]] / T).softmax(-1)[p[j + 1]].item() for j in range(B - 1)])
                          for p in paths], dtype=torch.float64)
    code = (ranks * torch.tensor([K ** (B - 1 - j) for j in range(B)])).sum(1)  # the path's index in `paths`
    seen = torch.bincount(code, minlength=len(paths)).double()
    assert stats.chisquare(seen, exact * n).pvalue > 0.01
    prev = torch.cat([torch.zeros(n, 1, dtype=torch.int64), ranks[:, :-1]], 1)
    rows = torch.cat([first.expand(n, 1, K), scores.expand(n, -1, -1, -1).gather(
        2, prev[:, 1:, None, None].expand(n, B - 1, 1, K))[:, :, 0]], 1)
    torch.testing.assert_close(q, (rows / T).softmax(-1))


def test_sampled_walk_at_temperature_zero_is_the_greedy_walk():
    torch.manual_seed(4)
    R, B, K = 6, 5, 4
    scores, first = torch.randn(R, B - 1, K, K), torch.randn(R, K)
    t = torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0, 0.5])  # per block; the zeros are greedy
    ranks, q = sample(scores, first, t, torch.Generator().manual_seed(0))
    greedy = dcoco.select(scores, first, "greedy")
    assert torch.equal(ranks[t == 0], greedy[t == 0])
    assert torch.equal(q[t == 0], torch.nn.functional.one_hot(greedy[t == 0], K).float())
    torch.testing.assert_close(q.sum(-1), torch.ones(R, B))


def test_sampled_walk_bad_arguments():
    with pytest.raises(ValueError, match="scores"):
        sample(torch.randn(2, 3, 4, 4), torch.randn(2, 5), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        sample(torch.randn(2, 3, 4, 4), torch.randn(2, 4), float("nan"))


def test_sampled_walk_bad_arguments_are_named():
    s, f = torch.randn(2, 3, 4, 4), torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"temperature: expected a number or a \(2,\) tensor, one per block, got "
                                         r"shape \(3,\)"):
        sample(s, f, torch.ones(3))
    with pytest.raises(TypeError, match="temperature: expected a number or a"):
        sample(s, f, "hot")
    with pytest.raises(TypeError, match="temperature: expected a floating-point tensor, got torch.int64"):
        sample(s, f, torch.ones(2, dtype=torch.long))
    for dtype in (torch.int64, torch.float64):  # what select refuses, sample refuses
        with pytest.raises(TypeError, match=f"scores: expected float32, bfloat16 or float16, got {dtype}"):
            sample(s.to(dtype), f.to(dtype), 1.0)
        with pytest.raises(TypeError, match="scores: expected float32"):
            dcoco.select(s.to(dtype), f.to(dtype))


@pytest.mark.parametrize("T", [1e-40, 1e-6, 0.0, -1.0])
def test_temperatures_below_the_floor_are_the_greedy_walk(T):
    """x / 1e-40 overflows float32 (q was all NaN, the ranks not greedy's): below TEMPERATURE_FLOOR the walk is
    select()'s, with q one-hot at it."""
    from dcoco.ops.select import TEMPERATURE_FLOOR

    torch.manual_seed(5)
    s, f = torch.randn(3, 4, 6, 6) * 3, torch.randn(3, 6) * 3
    ranks, q = sample(s, f, T, torch.Generator().manual_seed(0))
    assert T < TEMPERATURE_FLOOR
    greedy = dcoco.select(s, f, "greedy")
    assert torch.equal(ranks, greedy)
    assert torch.equal(q, torch.nn.functional.one_hot(greedy, 6).float())


def test_the_proposal_is_finite_over_non_finite_scores():
    """A NaN or -inf candidate is never drawn and has q = 0; a row all NaN / -inf is select()'s choice, q one-hot
    there; +inf is a point mass at the row's lowest-ranked +inf. q is finite and sums to 1 everywhere."""
    torch.manual_seed(6)
    R, B, K, n = 4, 3, 5, 400
    s, f = torch.randn(R, B - 1, K, K), torch.randn(R, K)
    f[0, 1], f[0, 3] = float("nan"), -math.inf          # block 0, slot 1: two candidates that cannot be drawn
    f[1] = float("nan")                                  # block 1, slot 1: nothing can be drawn
    f[2, 2] = f[2, 4] = math.inf                         # block 2, slot 1: a point mass at rank 2
    s[3, :, :, 0] = float("nan")                         # block 3: rank 0 never drawn after slot 1
    ranks, q = sample(s.repeat(n, 1, 1, 1), f.repeat(n, 1), 1.3, torch.Generator().manual_seed(1))
    ranks, q = ranks.view(n, R, B), q.view(n, R, B, K)
    assert q.isfinite().all()
    torch.testing.assert_close(q.sum(-1), torch.ones(n, R, B))
    assert not ((ranks[:, 0, 0] == 1) | (ranks[:, 0, 0] == 3)).any() and (q[:, 0, 0, [1, 3]] == 0).all()
    assert len(ranks[:, 0, 0].unique()) == 3  # the other three are drawn
    assert (ranks[:, 1, 0] == 0).all() and (q[:, 1, 0] == torch.eye(K)[0]).all()
    assert (ranks[:, 2, 0] == 2).all() and (q[:, 2, 0] == torch.eye(K)[2]).all()
    assert (ranks[:, 3, 1:] != 0).all() and (q[:, 3, 1:, 0] == 0).all()


def test_a_geometric_lam_beyond_float32_is_refused():
    """lam^(B-2) outside [2^-64, 2^64] overflowed float32 path sums (1e30 over 15 slots returned a path that is
    not the optimum); the bound depends on B, so a short block takes a larger lam."""
    s, f = torch.randn(1, 14, 16, 16), torch.randn(1, 16)
    for lam in (1e30, 1e-30):
        with pytest.raises(ValueError, match=r"lam: .* is beyond \[2\^-64, 2\^64\].*expected lam in \[0.03296, "
                                             r"30.34\] for B = 15"):
            dcoco.select(s, f, "geometric", lam)
    assert dcoco.select(s, f, "geometric", 20.0).shape == (1, 15)
    assert dcoco.select(torch.randn(1, 2, 4, 4), torch.randn(1, 4), "geometric", 1e15).shape == (1, 3)
    # an admissible large lam finds the optimum up to float32 rounding of the path sums (the first slots' terms,
    # 1e-12 of the last one's, are below it: they only break ties)
    s, f = torch.randn(8, 3, 3, 3), torch.randn(8, 3)
    torch.testing.assert_close(path_value(s, f, dcoco.select(s, f, "geometric", 1e6), 1e6),
                               path_value(s, f, ref.best_path(s, f, 1e6), 1e6), rtol=1e-6, atol=0)
    with pytest.raises(TypeError, match="lam: expected a number, got None"):
        dcoco.select(s, f, "geometric", None)
