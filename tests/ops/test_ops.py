"""Compiled ops vs the literal reference on fresh random inputs, the paper's corrector and, as a parameter, the anchor
transition (docs/spec.md, "Anchor transition")."""

import itertools

import pytest
import torch

import dcoco
from dcoco.testing import reference as ref

from helpers.cases import check_against_literal, make_case

pytestmark = pytest.mark.usefixtures("each_backend")  # every test on both backends

SHAPES = list(itertools.product([1, 3, 8], [2, 15, 16], [1, 4, 16], [64, 576, 4096]))
DTYPES = list(itertools.product([torch.float32, torch.bfloat16], [torch.int32, torch.int64]))
ANCHOR = pytest.mark.parametrize("anchor", [False, True], ids=["paper", "anchor"])


@pytest.mark.parametrize("R,B,K,d", SHAPES, ids=[f"R{R}-B{B}-K{K}-d{d}" for R, B, K, d in SHAPES])
def test_ops_match_reference(R, B, K, d):
    """Every shape, its dtypes cycled; every third with the anchor transition."""
    i = SHAPES.index((R, B, K, d))
    dtype, id_dtype = DTYPES[i % len(DTYPES)]
    case = make_case(R, B, K, d, dtype=dtype, id_dtype=id_dtype, seed=R * 1000 + B * 100 + K * 10 + d,
                     anchor=i % 3 == 1)
    check_against_literal(case)


@ANCHOR
@pytest.mark.parametrize("dtype,id_dtype", DTYPES + [(torch.float16, torch.int64)])
def test_every_dtype_combination(dtype, id_dtype, anchor):
    case = make_case(3, 15, 16, 576, dtype=dtype, id_dtype=id_dtype, seed=7, anchor=anchor)
    ranks = check_against_literal(case)
    # the corrector must actually move the walk in these cases, or the test would prove little
    assert (ranks != 0).any()


def test_the_anchor_moves_slot_one():
    """The anchor transition has teeth: S_0 re-ranks slot 1 somewhere, which the paper's prefix-first walk never
    does."""
    c = make_case(16, 4, 16, 64, V=300, seed=5, anchor=True)
    ranks = c.corrector(*c.inputs, **c.kw)[0]
    assert (ranks[:, 0] != 0).any()
    assert (c.plain(c.hidden[:, 1:], *c.inputs[1:])[0][:, 0] == 0).all()


def test_mixed_input_dtypes():
    case = make_case(2, 15, 16, 64, seed=3)
    h, ids, lg, E = case.inputs
    mixed = (h.bfloat16(), ids.int(), lg.half(), E.bfloat16())
    s_mixed = case.corrector.score(*mixed)
    s64 = ref.score(mixed[0].double(), ids, mixed[2].double(), mixed[3].double(),
                    *(w.double() for w in case.corrector.weights()))
    torch.testing.assert_close(s_mixed.double(), s64, rtol=1e-5, atol=1e-4)


def test_bf16_weights_are_upcast_exactly():
    case = make_case(2, 15, 16, 64, seed=4)
    case.corrector.bfloat16()
    s = case.corrector.score(*case.inputs)
    torch.testing.assert_close(s.double(), case.ref_scores(), rtol=1e-5, atol=1e-4)


def test_greedy_forward_equals_select_on_scores():
    case = make_case(8, 15, 16, 64, seed=5)
    scores = case.corrector.score(*case.inputs)
    ranks, _ = case.corrector(*case.inputs)
    assert torch.equal(ranks, dcoco.select(scores, case.cand_logits[:, 0], "greedy"))
    assert torch.equal(ranks, ref.greedy(scores, case.cand_logits[:, 0]))


@ANCHOR
@pytest.mark.parametrize("d", [64, 576])
def test_prepared_table_gives_the_same_walk(d, anchor):
    case = make_case(8, 15, 16, d, V=300, seed=6, anchor=anchor)
    unprepared = case.corrector(*case.inputs, **case.kw)[0]
    table = case.corrector.prepare_inference(case.embed)
    assert table.shape == (300, 128) and table.dtype == torch.float32
    ranks = check_against_literal(case)
    assert (ranks == unprepared).float().mean() > 0.99


@ANCHOR
def test_zero_initialised_output_layer_keeps_the_drafters_argmax(anchor):
    """Delta = 0: every transition's row is the next slot's logits (and S_0 slot 1's), so the walk keeps rank 0."""
    g = torch.Generator().manual_seed(11)
    for d, K in ((64, 16), (576, 4), (4096, 16)):
        m = dcoco.Corrector(d, num_candidates=K, anchor_transition=anchor)
        R, B, V = 4, 15, 1000
        hidden = torch.randn(R, B + anchor, d, generator=g)
        ids = torch.randint(0, V, (R, B, K), generator=g)
        logits = torch.randn(R, B, K, generator=g).sort(-1, descending=True).values
        embed = torch.randn(V, d, generator=g)
        kw = {"anchor_ids": torch.randint(0, V, (R,), generator=g)} if anchor else {}
        ranks, tokens = m(hidden, ids, logits, embed, **kw)
        assert torch.equal(ranks, torch.zeros(R, B, dtype=torch.int64))
        assert torch.equal(tokens, ids[..., 0])
        first, grid = m.walk_inputs(m.score(hidden, ids, logits, embed, **kw), logits)
        assert torch.equal(first, logits[:, 0])
        torch.testing.assert_close(grid, logits[:, 1:, None, :].expand(R, B - 1, K, K), rtol=0, atol=0)


def test_noncontiguous_inputs_are_handled():
    case = make_case(3, 15, 16, 64, seed=8)
    h, ids, lg, E = case.inputs
    h_nc = torch.randn(64, 3, 15).permute(1, 2, 0)
    h_nc.copy_(h)
    ids_nc = ids.transpose(0, 1).contiguous().transpose(0, 1)
    E_nc = torch.cat([E, E], 1)[:, ::2]
    E_nc.copy_(E)
    assert not (h_nc.is_contiguous() or ids_nc.is_contiguous() or E_nc.is_contiguous())
    torch.testing.assert_close(case.corrector.score(h_nc, ids_nc, lg, E_nc), case.corrector.score(*case.inputs),
                               rtol=0, atol=0)


@pytest.mark.fused_only  # the core's fixed summation order; torch's own kernels promise no such thing
def test_results_are_deterministic_across_thread_counts():
    case = make_case(8, 15, 16, 576, seed=9)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = case.corrector.score(*case.inputs), case.corrector(*case.inputs)
        torch.set_num_threads(max(n, 2))
        many = case.corrector.score(*case.inputs), case.corrector(*case.inputs)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1][0], many[1][0])


@ANCHOR
def test_single_slot_and_empty_batch(anchor):
    """B = 1: an empty grid (with the anchor transition S_0 alone re-ranks the one slot); R = 0: empty outputs."""
    case = make_case(2, 1, 4, 64, seed=10, anchor=anchor)
    with torch.no_grad():
        first, grid = case.corrector.walk_inputs(case.corrector.score(*case.inputs, **case.kw), case.cand_logits)
    assert grid.shape == (2, 0, 4, 4)
    torch.testing.assert_close(first.double(), case.ref_first(), rtol=1e-5, atol=1e-4)
    ranks, tokens = case.corrector(*case.inputs, **case.kw)
    assert torch.equal(ranks[:, 0], first.argmax(-1))
    empty = make_case(1, 15, 4, 64, seed=10, anchor=anchor)
    inputs = [t[:0] for t in empty.inputs[:3]] + [empty.embed]
    kw = {k: v[:0] for k, v in empty.kw.items()}
    assert empty.corrector.score(*inputs, **kw).shape == (0, 14 + anchor, 4, 4)
    ranks, tokens = empty.corrector(*inputs, **kw)
    assert ranks.shape == tokens.shape == (0, 15)


@pytest.mark.fused_only
def test_opcheck_every_op():
    case = make_case(2, 4, 4, 64, seed=12)
    w = case.corrector.weights()
    w = tuple(t.detach() for t in w)
    torch.library.opcheck(torch.ops.dcoco.score.default, (*case.inputs, *w))
    torch.library.opcheck(torch.ops.dcoco.correct.default, (*case.inputs, *w, None))
    table = torch.ops.dcoco.cand_table(case.embed, w[0], w[2])
    torch.library.opcheck(torch.ops.dcoco.correct.default, (*case.inputs, *w, table))
    torch.library.opcheck(torch.ops.dcoco.cand_table.default, (case.embed, w[0], w[2]))
    scores = torch.ops.dcoco.score(*case.inputs, *w)
    for rule in ("greedy", "global", "geometric"):
        torch.library.opcheck(torch.ops.dcoco.select.default, (scores, case.cand_logits[:, 0], rule, 0.75))


@ANCHOR
def test_torch_compile_fullgraph(each_backend, anchor):
    """fullgraph=True fails on any graph break: score, walk_inputs, the walk and the path rules in one graph."""
    case = make_case(3, 15, 16, 64, seed=13, anchor=anchor)
    m = case.corrector
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def step(hidden, ids, logits, embed, kw):
        first, grid = m.walk_inputs(m.score(hidden, ids, logits, embed, **kw), logits)
        ranks, tokens = m(hidden, ids, logits, embed, **kw)
        return first, grid, ranks, [dcoco.select(grid, first, rule, 0.75) for rule in ("global", "geometric")]

    with torch.no_grad():
        first, grid, ranks, rules = step(*case.inputs, case.kw)
        want_first, want_grid = m.walk_inputs(m.score(*case.inputs, **case.kw), case.cand_logits)
    tol = 0 if each_backend == "fused" else 1e-5  # inductor fuses the native path and reorders its float sums
    torch.testing.assert_close(grid, want_grid, rtol=tol, atol=tol)
    torch.testing.assert_close(first, want_first, rtol=tol, atol=tol)
    assert torch.equal(ranks, m(*case.inputs, **case.kw)[0])
    for rule, got in zip(("global", "geometric"), rules):
        assert torch.equal(got, dcoco.select(grid, first, rule, 0.75)), rule


def test_the_compiled_maximum_of_candidates_and_a_large_batch():
    """K = MAX_CANDIDATES (64) and R = 300 requests (many row blocks and threads' tasks) against the reference."""
    for R, K, d in ((2, dcoco.MAX_CANDIDATES, 64), (300, 4, 8)):
        case = make_case(R, 6, K, d, V=max(4 * K, 97), seed=R + K)
        check_against_literal(case)


def test_concurrent_calls_from_python_threads():
    """The core releases the GIL and keeps per-thread workspaces: parallel callers get the sequential results."""
    from concurrent.futures import ThreadPoolExecutor

    cases = [make_case(4, 15, 16, 576, seed=20 + i) for i in range(4)]
    want = [(c.corrector.score(*c.inputs), c.corrector(*c.inputs)[0]) for c in cases]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda c: (c.corrector.score(*c.inputs), c.corrector(*c.inputs)[0]), cases * 3))
    for i, (s, r) in enumerate(got):
        assert torch.equal(s, want[i % 4][0]) and torch.equal(r, want[i % 4][1])
