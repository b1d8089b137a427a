"""Compiled ops vs the literal reference on fresh random inputs."""

import itertools

import pytest
import torch

import dcoco
from dcoco.testing import reference as ref

from helpers.cases import assert_walk_matches, make_case

pytestmark = pytest.mark.usefixtures("each_backend")  # every test on both backends

SHAPES = list(itertools.product([1, 3, 8], [2, 15, 16], [1, 4, 16], [64, 576, 4096]))
DTYPES = list(itertools.product([torch.float32, torch.bfloat16], [torch.int32, torch.int64]))


def check_case(case, seed_tag=""):
    s64 = case.ref_scores()
    scale = s64.abs().max().item() + 1.0
    scores = case.corrector.score(*case.inputs)
    assert scores.dtype == torch.float32 and not scores.isnan().any(), seed_tag
    # fp32 compute on exactly-upcast inputs: ~1e-6 relative to the scores' scale
    torch.testing.assert_close(scores.double(), s64, rtol=1e-5, atol=2e-5 * scale, msg=seed_tag)
    ranks, tokens = case.corrector(*case.inputs)
    assert_walk_matches(ranks, s64, case.cand_logits[:, 0], atol=1e-4 * scale)
    assert torch.equal(tokens, torch.gather(case.cand_ids.long(), 2, ranks[..., None])[..., 0])
    return s64, ranks


@pytest.mark.parametrize("R,B,K,d", SHAPES, ids=[f"R{R}-B{B}-K{K}-d{d}" for R, B, K, d in SHAPES])
def test_ops_match_reference(R, B, K, d):
    dtype, id_dtype = DTYPES[SHAPES.index((R, B, K, d)) % len(DTYPES)]
    case = make_case(R, B, K, d, dtype=dtype, id_dtype=id_dtype, seed=R * 1000 + B * 100 + K * 10 + d)
    check_case(case, f"{dtype} {id_dtype}")


@pytest.mark.parametrize("dtype,id_dtype", DTYPES + [(torch.float16, torch.int64)])
def test_every_dtype_combination(dtype, id_dtype):
    case = make_case(3, 15, 16, 576, dtype=dtype, id_dtype=id_dtype, seed=7)
    s64, ranks = check_case(case)
    # the corrector must actually move the walk in these cases, or the test would prove little
    assert (ranks != 0).any()


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


@pytest.mark.parametrize("d", [64, 576])
def test_prepared_table_gives_the_same_walk(d):
    case = make_case(8, 15, 16, d, V=300, seed=6)
    plain_ranks, plain_tokens = case.corrector(*case.inputs)
    table = case.corrector.prepare_inference(case.embed)
    assert table.shape == (300, 128) and table.dtype == torch.float32
    ranks, tokens = case.corrector(*case.inputs)
    assert_walk_matches(ranks, case.ref_scores(), case.cand_logits[:, 0], atol=1e-4)
    assert torch.equal(tokens, torch.gather(case.cand_ids, 2, ranks[..., None])[..., 0])
    assert (ranks == plain_ranks).float().mean() > 0.99


def test_zero_initialised_output_layer_keeps_the_drafters_argmax():
    g = torch.Generator().manual_seed(11)
    for d, K in ((64, 16), (576, 4), (4096, 16)):
        m = dcoco.Corrector(d, num_candidates=K)
        R, B, V = 4, 15, 1000
        hidden = torch.randn(R, B, d, generator=g)
        ids = torch.randint(0, V, (R, B, K), generator=g)
        logits = torch.randn(R, B, K, generator=g).sort(-1, descending=True).values
        embed = torch.randn(V, d, generator=g)
        ranks, tokens = m(hidden, ids, logits, embed)
        assert torch.equal(ranks, torch.zeros(R, B, dtype=torch.int64))
        assert torch.equal(tokens, ids[..., 0])
        scores = m.score(hidden, ids, logits, embed)
        torch.testing.assert_close(scores, logits[:, 1:, None, :].expand(R, B - 1, K, K), rtol=0, atol=0)


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


def test_single_slot_and_empty_batch():
    case = make_case(2, 1, 4, 64, seed=10)
    scores = case.corrector.score(*case.inputs)
    assert scores.shape == (2, 0, 4, 4)
    ranks, tokens = case.corrector(*case.inputs)
    assert torch.equal(ranks, case.cand_logits[:, :, :].float().argmax(-1))
    empty = make_case(1, 15, 4, 64, seed=10)
    inputs = [t[:0] for t in empty.inputs[:3]] + [empty.embed]
    assert empty.corrector.score(*inputs).shape == (0, 14, 4, 4)
    ranks, tokens = empty.corrector(*inputs)
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


def test_torch_compile_fullgraph(each_backend):
    case = make_case(3, 15, 16, 64, seed=13)
    m = case.corrector

    @torch.compile(fullgraph=True)
    def step(hidden, ids, logits, embed):
        scores = m.score(hidden, ids, logits, embed)
        ranks, tokens = m(hidden, ids, logits, embed)
        return scores, ranks, tokens, dcoco.select(scores, logits[:, 0], "geometric", 0.75)

    with torch.no_grad():
        scores, ranks, tokens, geo = step(*case.inputs)
    tol = 0 if each_backend == "fused" else 1e-5  # inductor fuses the native path and reorders its float sums
    torch.testing.assert_close(scores, m.score(*case.inputs), rtol=tol, atol=tol)
    assert torch.equal(ranks, m(*case.inputs)[0])
    assert torch.equal(geo, dcoco.select(scores, case.cand_logits[:, 0], "geometric", 0.75))


def test_the_compiled_maximum_of_candidates_and_a_large_batch():
    """K = MAX_CANDIDATES (64) and R = 300 requests (many row blocks and threads' tasks) against the reference."""
    for R, K, d in ((2, dcoco.MAX_CANDIDATES, 64), (300, 4, 8)):
        case = make_case(R, 6, K, d, V=max(4 * K, 97), seed=R + K)
        check_case(case, f"R={R} K={K}")


def test_concurrent_calls_from_python_threads():
    """The core releases the GIL and keeps per-thread workspaces: parallel callers get the sequential results."""
    from concurrent.futures import ThreadPoolExecutor

    cases = [make_case(4, 15, 16, 576, seed=20 + i) for i in range(4)]
    want = [(c.corrector.score(*c.inputs), c.corrector(*c.inputs)[0]) for c in cases]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda c: (c.corrector.score(*c.inputs), c.corrector(*c.inputs)[0]), cases * 3))
    for i, (s, r) in enumerate(got):
        assert torch.equal(s, want[i % 4][0]) and torch.equal(r, want[i % 4][1])
