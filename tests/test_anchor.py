"""The anchor transition (docs/spec.md, "Anchor transition"): Corrector(anchor_transition=True) scores slot 1's
candidates from the anchor, S_0, through the unchanged core over B+1 slots. S_0, the grid, the greedy walk and the
path rules against the float64 literal (dcoco.testing.reference) on both backends; the extension off is the paper's
corrector bit for bit; named errors."""

import pytest
import torch

import dcoco
from dcoco.loss import correction_loss
from dcoco.ops.select import sample
from dcoco.testing import reference as ref

from helpers.anchor import anchored, make_anchor_case
from helpers.cases import assert_walk_matches, backend_score, make_case

pytestmark = pytest.mark.usefixtures("each_backend")  # every test on both backends

SHAPES = [  # R, B, K, d, input dtype, id dtype
    (1, 2, 1, 64, torch.float32, torch.int64),
    (3, 15, 16, 64, torch.bfloat16, torch.int32),
    (2, 2, 16, 96, torch.float16, torch.int64),
    (1, 15, 4, 576, torch.float32, torch.int32),
    (4, 5, 16, 64, torch.bfloat16, torch.int64),
    (2, 15, 1, 64, torch.float16, torch.int64),
]


def scores_of(c, **kw):
    with torch.no_grad():  # the native backend gathers the prepared table only without gradients
        scores = c.corrector.score(*c.inputs, anchor_ids=c.anchor_ids, **kw)
    return scores, *c.corrector.walk_inputs(scores, c.cand_logits)


@pytest.mark.parametrize("prepared", [False, True], ids=["embed", "table"])
@pytest.mark.parametrize("R,B,K,d,dtype,id_dtype", SHAPES)
def test_first_grid_and_walk_match_the_literal(R, B, K, d, dtype, id_dtype, prepared):
    c = make_anchor_case(R, B, K, d, V=300, dtype=dtype, id_dtype=id_dtype, seed=R * 100 + B * 10 + K + d)
    if prepared:
        c.corrector.prepare_inference(c.embed)
    scores, first, grid = scores_of(c)
    assert scores.shape == (R, B, K, K) and scores.dtype == torch.float32
    assert first.shape == (R, K) and grid.shape == (R, B - 1, K, K)
    assert torch.equal(scores[:, 0], first[:, None].expand(R, K, K))  # every row of the anchor's grid is S_0
    f64, g64 = c.ref_first(), c.ref_grid()
    scale = max(f64.abs().max().item(), g64.abs().max().item() if B > 1 else 0.0) + 1.0
    # float32 arithmetic on exactly-upcast inputs: ~1e-6 of the scores' scale
    torch.testing.assert_close(first.double(), f64, rtol=1e-5, atol=2e-5 * scale)
    torch.testing.assert_close(grid.double(), g64, rtol=1e-5, atol=2e-5 * scale)
    ranks, tokens = c.corrector(*c.inputs, anchor_ids=c.anchor_ids)
    assert ranks.shape == tokens.shape == (R, B) and ranks.dtype == tokens.dtype == torch.int64
    # the walk from the anchor: its one candidate (rank 0 of K zero logits), then S_0's row, then S_1.. as before
    walk = torch.cat([torch.zeros(R, 1, dtype=torch.int64), ranks], 1)
    assert_walk_matches(walk, anchored(f64, g64), torch.zeros(R, K), atol=1e-4 * scale)
    assert torch.equal(tokens, c.cand_ids.long().gather(2, ranks[..., None])[..., 0])
    assert torch.equal(ranks, dcoco.select(grid, first, "greedy"))  # the same S, walked by select


def test_the_anchor_moves_slot_one():
    """The check above has teeth: with an active corrector S_0 re-ranks slot 1 somewhere, which the paper's
    prefix-first walk never does."""
    c = make_anchor_case(16, 4, 16, 64, V=300, seed=5)
    ranks = c.corrector(*c.inputs, anchor_ids=c.anchor_ids)[0]
    assert (ranks[:, 0] != 0).any()
    assert (c.plain(c.hidden[:, 1:], *c.inputs[1:])[0][:, 0] == 0).all()


RULE_SHAPES = [(3, 2, 16), (2, 4, 3), (2, 5, 4), (1, 15, 1), (4, 3, 5), (1, 6, 2)]  # K^B paths: up to 1024


@pytest.mark.parametrize("rule,lam", [("global", 1.0), ("geometric", 0.75), ("geometric", 0.3)])
@pytest.mark.parametrize("R,B,K", RULE_SHAPES)
def test_path_rules_find_the_best_path_from_the_anchor(R, B, K, rule, lam):
    """select(grid, S_0): the path maximising S_0(k_1) + sum_p w_p S_p(k_p, k_{p+1}), w_p = 1 or lam^(p-1), against
    the brute force over all K^B paths on the float64 literal scores."""
    c = make_anchor_case(R, B, K, 64, V=200, seed=R + 10 * B + 100 * K)
    _, first, grid = scores_of(c)
    f64, g64 = c.ref_first(), c.ref_grid()
    w = 1.0 if rule == "global" else lam
    best = ref.best_path(g64, f64, w)
    ranks = dcoco.select(grid, first, rule, lam)
    scale = f64.abs().max().item() + g64.abs().max().item() * B + 1.0
    same = (ranks == best).all(1)
    # the same path, or (float32 rounding of a near tie) one whose literal value is within rounding of the best
    torch.testing.assert_close(path_value(g64, f64, ranks, w)[~same], path_value(g64, f64, best, w)[~same],
                               rtol=0, atol=1e-5 * scale)
    assert same.float().mean() >= 0.5
    if rule == "global":  # the greedy walk's path is one of the K^B: never better than the best
        greedy = c.corrector(*c.inputs, anchor_ids=c.anchor_ids)[0]
        assert (path_value(g64, f64, greedy, 1.0) <= path_value(g64, f64, best, 1.0) + 1e-5 * scale).all()


def path_value(g64, f64, ranks, w):
    R, T = g64.shape[:2]
    v = f64.gather(1, ranks[:, :1])[:, 0]
    for p in range(T):
        v = v + w ** p * g64[torch.arange(R), p, ranks[:, p], ranks[:, p + 1]]
    return v


@pytest.mark.parametrize("R,B,K", [(3, 2, 16), (4, 15, 16), (1, 15, 1), (5, 6, 4)])
def test_sampling_at_temperature_zero_is_the_greedy_walk(R, B, K):
    c = make_anchor_case(R, B, K, 64, V=200, seed=R + B + K)
    _, first, grid = scores_of(c)
    greedy = c.corrector(*c.inputs, anchor_ids=c.anchor_ids)[0]
    gen = torch.Generator().manual_seed(0)
    for t in (0.0, 1e-7):
        ranks, q = sample(grid, first, t, gen)
        assert torch.equal(ranks, greedy), t
    assert torch.equal(q.argmax(-1), greedy)  # the proposal concentrates on the walk as T -> 0


@pytest.mark.parametrize("rule", ["greedy", "global", "geometric"])
def test_ties_go_to_the_lower_rank(rule):
    """A candidate of slot 1 copied (id and logit) to another rank ties with it exactly in S_0 and in every
    transition after it: each rule keeps the lower of the two ranks."""
    c = make_anchor_case(6, 4, 5, 64, V=200, seed=9)
    _, first, _ = scores_of(c)
    top = first.argmax(-1)
    other = (top + 1 + torch.arange(6) % 4) % 5  # another rank, above or below the winner
    for q in range(6):
        c.cand_ids[q, 0, other[q]] = c.cand_ids[q, 0, top[q]]
        c.cand_logits[q, 0, other[q]] = c.cand_logits[q, 0, top[q]]
    _, first, grid = scores_of(c)
    rows = torch.arange(6)
    assert torch.equal(first[rows, top], first[rows, other])
    ranks = (c.corrector(*c.inputs, anchor_ids=c.anchor_ids)[0] if rule == "greedy"
             else dcoco.select(grid, first, rule, 0.75))
    assert not (ranks[:, 0] == torch.maximum(top, other)).any(), (ranks[:, 0], top, other)
    assert (ranks[:, 0] == torch.minimum(top, other)).any()  # some paths do go through the tied pair
    if rule == "greedy":
        assert torch.equal(ranks[:, 0], torch.minimum(top, other))
        assert torch.equal(ranks, ref.greedy(grid, first))


@pytest.mark.parametrize("prepared", [False, True], ids=["embed", "table"])
def test_off_is_the_paper_bit_for_bit(prepared):
    """anchor_transition=False: score, forward, walk_inputs and the loss without anchor_scores are exactly what a
    corrector built without the flag gives, and what the backend's op gives."""
    c = make_case(3, 15, 16, 64, V=300, seed=21)
    off = dcoco.Corrector(64, num_candidates=16, anchor_transition=False)
    off.load_state_dict(c.corrector.state_dict())
    if prepared:
        off.prepare_inference(c.embed)
        c.corrector.prepare_inference(c.embed)
    with torch.no_grad():
        scores = off.score(*c.inputs)
        assert torch.equal(scores, c.corrector.score(*c.inputs))
        if not prepared:
            assert torch.equal(scores, backend_score(*c.inputs, off.weights()))
    ranks, tokens = off(*c.inputs)
    want = c.corrector(*c.inputs)
    assert torch.equal(ranks, want[0]) and torch.equal(tokens, want[1])
    first, grid = off.walk_inputs(scores, c.cand_logits)
    assert first is not None and torch.equal(first, c.cand_logits[:, 0]) and grid is scores
    target = c.cand_ids[:, :, 2].clone()
    valid = torch.ones(3, 15, dtype=torch.bool)
    assert torch.equal(correction_loss(scores, c.cand_ids, target, valid, anchor_scores=None),
                       correction_loss(scores, c.cand_ids, target, valid))


@pytest.mark.parametrize("rule", ["greedy", "global", "geometric"])
def test_zero_output_layer_keeps_the_drafters_argmax(rule):
    """A fresh corrector with the extension on: Delta = 0, so S_0 = l_1 and S_p = l_{p+1} exactly, and every rule
    picks rank 0 everywhere (the logits sorted, rank 0 the argmax)."""
    c = make_anchor_case(4, 15, 16, 64, V=300, seed=22)
    with torch.no_grad():
        c.corrector.mlp[2].weight.zero_()
        c.corrector.mlp[2].bias.zero_()
    scores, first, grid = scores_of(c)
    lg = c.cand_logits.float()
    assert torch.equal(first, lg[:, 0]) and torch.equal(grid, lg[:, 1:, None, :].expand_as(grid))
    ranks = (c.corrector(*c.inputs, anchor_ids=c.anchor_ids)[0] if rule == "greedy"
             else dcoco.select(grid, first, rule, 0.75))
    assert torch.equal(ranks, torch.zeros(4, 15, dtype=torch.int64))


def test_one_slot_and_no_blocks():
    """B = 1: S_0 alone re-ranks the one slot (an empty grid after it); R = 0: empty outputs."""
    c = make_anchor_case(3, 1, 8, 64, V=200, seed=23)
    scores, first, grid = scores_of(c)
    assert scores.shape == (3, 1, 8, 8) and grid.shape == (3, 0, 8, 8)
    torch.testing.assert_close(first.double(), c.ref_first(), rtol=1e-5, atol=1e-4)
    ranks, _ = c.corrector(*c.inputs, anchor_ids=c.anchor_ids)
    assert torch.equal(ranks[:, 0], first.argmax(-1))
    e = make_anchor_case(1, 4, 8, 64, V=200, seed=24)
    h, ids, lg, E = e.inputs
    ranks, tokens = e.corrector(h[:0], ids[:0], lg[:0], E, anchor_ids=e.anchor_ids[:0])
    assert ranks.shape == tokens.shape == (0, 4)
    assert e.corrector.score(h[:0], ids[:0], lg[:0], E, anchor_ids=e.anchor_ids[:0]).shape == (0, 4, 8, 8)


def test_an_out_of_range_anchor_off_the_cpu_is_nan(monkeypatch):
    """Where a check would sync (CUDA, a compiled graph), the native path clamps the anchor's id and makes its
    logit NaN, as for any candidate: that block's S_0 is NaN and its walk keeps slot 1 at rank 0; the others are
    untouched."""
    if dcoco.get_backend() != "native":
        pytest.skip("the fused CPU core always checks (IndexError: test_bad_anchor_arguments_are_named)")
    from dcoco.ops import native

    c = make_anchor_case(3, 5, 4, 64, V=200, seed=28)
    clean_first, clean_ranks = scores_of(c)[1], c.corrector(*c.inputs, anchor_ids=c.anchor_ids)[0]
    monkeypatch.setattr(native, "is_compiling", lambda: True)
    c.anchor_ids[1] = 200
    _, first, grid = scores_of(c)
    ranks = c.corrector(*c.inputs, anchor_ids=c.anchor_ids)[0]
    assert first[1].isnan().all() and ranks[1, 0] == 0
    keep = torch.tensor([0, 2])
    assert torch.equal(first[keep], clean_first[keep]) and torch.equal(ranks[keep], clean_ranks[keep])


def bad_calls(c):
    """(what, call, exception, message fragment): each names the argument at fault."""
    h, ids, lg, E = c.inputs
    a = c.anchor_ids
    m, plain = c.corrector, c.plain
    return [
        ("missing", lambda: m(h, ids, lg, E), ValueError, "anchor_ids: the anchor transition is on"),
        ("missing in score", lambda: m.score(h, ids, lg, E), ValueError, "anchor_ids: the anchor transition is on"),
        ("given when off", lambda: plain(h[:, 1:], ids, lg, E, anchor_ids=a), ValueError,
         r"anchor_ids: this corrector has no anchor transition"),
        ("given when off, score", lambda: plain.score(h[:, 1:], ids, lg, E, anchor_ids=a), ValueError,
         r"anchor_ids: this corrector has no anchor transition"),
        ("a list", lambda: m(h, ids, lg, E, anchor_ids=a.tolist()), TypeError, "anchor_ids: expected a torch.Tensor"),
        ("float", lambda: m(h, ids, lg, E, anchor_ids=a.float()), TypeError, "anchor_ids: expected int32 or int64"),
        ("bool", lambda: m.score(h, ids, lg, E, anchor_ids=a > 0), TypeError, "anchor_ids: expected int32 or int64"),
        ("(R,1)", lambda: m(h, ids, lg, E, anchor_ids=a[:, None]), ValueError, r"anchor_ids: expected .*\(2,\)"),
        ("(R+1,)", lambda: m.score(h, ids, lg, E, anchor_ids=torch.cat([a, a])), ValueError,
         r"anchor_ids: expected .*\(2,\)"),
        ("device", lambda: m(h, ids, lg, E, anchor_ids=a.to("meta")), ValueError, "anchor_ids: expected .* on cpu"),
        ("hidden (R,B,d)", lambda: m(h[:, 1:], ids, lg, E, anchor_ids=a), ValueError, r"hidden: .*\(R,B\+1,d\)"),
        ("hidden (R,B+2,d)", lambda: m.score(torch.cat([h, h[:, :1]], 1), ids, lg, E, anchor_ids=a), ValueError,
         r"hidden: .*\(R,B\+1,d\)"),
        ("hidden 2-D", lambda: m(h[0], ids, lg, E, anchor_ids=a), ValueError, "hidden: "),
        ("cand_ids 2-D", lambda: m(h, ids[0], lg, E, anchor_ids=a), ValueError, "cand_ids: expected 3 dimensions"),
        ("anchor id out of range", lambda: m(h, ids, lg, E, anchor_ids=torch.tensor([3, 200])), IndexError,
         r"anchor_ids\[1\] = 200 is outside \[0, V=200\)"),
    ]


@pytest.mark.parametrize("which", range(15))
def test_bad_anchor_arguments_are_named(which):
    c = make_anchor_case(2, 4, 3, 32, V=200, seed=25)
    what, call, exc, msg = bad_calls(c)[which]
    with pytest.raises(exc, match=msg):
        call()


def test_bad_anchor_scores_in_the_loss_are_named():
    g = torch.Generator().manual_seed(26)
    grid, ids = torch.randn(2, 3, 4, 4, generator=g), torch.randint(0, 50, (2, 4, 4), generator=g)
    target, valid = ids[:, :, 0].clone(), torch.ones(2, 4, dtype=torch.bool)
    for bad, exc, msg in [(torch.randn(2, 5), ValueError, r"anchor_scores: expected shape \(2, 4\)"),
                          (torch.randn(3, 4), ValueError, r"anchor_scores: expected shape \(2, 4\)"),
                          (torch.randn(2, 4, 1), ValueError, "anchor_scores: expected 2 dimensions"),
                          (torch.randn(2, 4, device="meta"), ValueError, "anchor_scores: expected .* on cpu"),
                          (torch.zeros(2, 4, dtype=torch.int64), TypeError, "anchor_scores: expected"),
                          ([[0.0] * 4] * 2, TypeError, "anchor_scores: expected a torch.Tensor")]:
        with pytest.raises(exc, match=msg):
            correction_loss(grid, ids, target, valid, anchor_scores=bad)
    with pytest.raises(TypeError, match="anchor_transition: expected a bool"):
        dcoco.Corrector(32, anchor_transition=1)


def test_compiles_fullgraph(each_backend):
    """fullgraph=True fails on any graph break: the anchor's slots, score with its backward through the loss's
    anchor term, walk_inputs, the walk and the path rules, all in one graph (aot_eager: Dynamo and AOT autograd,
    without inductor's C++ builds)."""
    c = make_anchor_case(3, 6, 16, 64, V=200, seed=27)
    m = c.corrector
    target, valid = c.cand_ids[:, :, 1].clone(), torch.ones(3, 6, dtype=torch.bool)
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss_fn(hidden, ids, logits, embed, anchor):
        first, grid = m.walk_inputs(m.score(hidden, ids, logits, embed, anchor_ids=anchor), logits)
        return correction_loss(grid, ids, target, valid, anchor_scores=first)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def infer(hidden, ids, logits, embed, anchor):
        first, grid = m.walk_inputs(m.score(hidden, ids, logits, embed, anchor_ids=anchor), logits)
        rules = [dcoco.select(grid, first, rule, 0.75) for rule in ("greedy", "global", "geometric")]
        return m(hidden, ids, logits, embed, anchor_ids=anchor)[0], rules

    h = c.hidden.clone().requires_grad_()
    loss_fn(h, c.cand_ids, c.cand_logits, c.embed, c.anchor_ids).backward()
    h2 = c.hidden.clone().requires_grad_()
    loss_fn.__wrapped__(h2, c.cand_ids, c.cand_logits, c.embed, c.anchor_ids).backward()
    torch.testing.assert_close(h.grad, h2.grad, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        walked, rules = infer(c.hidden, c.cand_ids, c.cand_logits, c.embed, c.anchor_ids)
        _, first, grid = scores_of(c)
    assert torch.equal(walked, m(*c.inputs, anchor_ids=c.anchor_ids)[0])
    for rule, got in zip(("greedy", "global", "geometric"), rules):
        assert torch.equal(got, dcoco.select(grid, first, rule, 0.75)), rule
