"""The Corrector module: exact parameterisation, initialisation, the inference table's lifecycle and its faults
(inference mode, a stale or replaced weight, `.data` writes), the anchor transition switched off, its anchor ids
never narrowed and out of range off the CPU, build info."""

import os
import shutil

import pytest
import torch

import dcoco
from dcoco import Corrector

from dcoco.loss import correction_loss

from helpers.cases import backend_score, make_case
from helpers.tiny_models import SMALL_D as D, SMALL_V as V

pytestmark = pytest.mark.usefixtures("each_backend")  # every test on both backends

NAMES = {"cand_proj.weight": (128, "d"), "ctx_proj.weight": (128, "d"), "fuse_proj.weight": (128, 256),
         "fuse_norm.weight": (128,), "fuse_norm.bias": (128,), "pair_proj.weight": (128, "2d"),
         "mlp.0.weight": (256, 386), "mlp.0.bias": (256,), "mlp.2.weight": (1, 256), "mlp.2.bias": (1,)}


@pytest.mark.parametrize("d,count", [(4096, 2_229_505), (2560, 1_443_073)])
def test_exact_parameters(d, count):
    m = dcoco.Corrector(d)
    assert sum(p.numel() for p in m.parameters()) == count
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    want = {n: tuple(d if x == "d" else 2 * d if x == "2d" else x for x in s) for n, s in NAMES.items()}
    assert shapes == want
    assert set(m.state_dict()) == set(NAMES)  # no buffers either: the inference table is not state


def test_initialisation():
    m = dcoco.Corrector(64)
    assert torch.count_nonzero(m.mlp[2].weight) == 0 and torch.count_nonzero(m.mlp[2].bias) == 0
    assert m.fuse_norm.eps == 1e-5
    assert isinstance(m.mlp[1], torch.nn.GELU) and m.mlp[1].approximate == "none"


def test_state_dict_round_trip_keeps_results():
    case = make_case(3, 15, 16, 64, seed=1)
    other = dcoco.Corrector(64)
    other.load_state_dict(case.corrector.state_dict())
    assert torch.equal(other.score(*case.inputs), case.corrector.score(*case.inputs))


def test_stale_table_falls_back_with_a_warning():
    case = make_case(4, 15, 16, 64, seed=2)
    m = case.corrector
    m.prepare_inference(case.embed)
    with torch.no_grad():
        m.cand_proj.weight.mul_(-1.0)  # in-place update after preparing: the table no longer matches
    want = make_case(4, 15, 16, 64, seed=2)
    with torch.no_grad():
        want.corrector.cand_proj.weight.mul_(-1.0)
    with pytest.warns(UserWarning, match="stale"):
        ranks, _ = m(*case.inputs)
    assert torch.equal(ranks, want.corrector(*case.inputs)[0])
    other_embed = case.embed.clone()
    m.prepare_inference(case.embed)
    with pytest.warns(UserWarning, match="stale"):
        m(case.hidden, case.cand_ids, case.cand_logits, other_embed)


@pytest.mark.parametrize("replace", ["load_state_dict_assign", "new_parameter", "new_linear"])
def test_preparing_again_never_writes_into_replaced_parameters(replace):
    """prepare_inference keeps copies it owns: after the parameters are replaced (an EMA loaded with assign=True,
    a new nn.Parameter, a new nn.Linear) and the corrector prepared again, the old tensors hold their old values
    and the drafts are the new weights' drafts."""
    case = make_case(4, 15, 16, 64, seed=3)
    m = case.corrector
    new = make_case(4, 15, 16, 64, seed=4).corrector  # other weights, the same shapes
    m.prepare_inference(case.embed)
    old = [w.detach().clone() for w in m.weights()]
    held = list(m.weights())  # what an optimizer would still hold
    if replace == "load_state_dict_assign":
        m.load_state_dict({k: v.clone() for k, v in new.state_dict().items()}, assign=True)
    elif replace == "new_parameter":
        for (name, _p), q in zip(m.named_parameters(), list(new.parameters())):
            mod = m.get_submodule(name.rpartition(".")[0])
            setattr(mod, name.rpartition(".")[2], torch.nn.Parameter(q.detach().clone()))
    else:  # new Linear layers for the MLP; the other weights copied in place (the caller's own write)
        for k in (0, 2):
            lin = torch.nn.Linear(*reversed(m.mlp[k].weight.shape))
            lin.load_state_dict(new.mlp[k].state_dict())
            m.mlp[k] = lin
        with torch.no_grad():
            for w, v in zip(m.weights()[:6], new.weights()[:6]):
                w.copy_(v)
        held, old = held[6:], old[6:]  # the old Linear layers' tensors
    m.prepare_inference(case.embed)
    for w, before in zip(held, old):
        assert torch.equal(w.detach(), before)  # nothing written into tensors the corrector no longer owns
    want = new(*case.inputs)
    got = m(*case.inputs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_cuda_available_says_no_here_and_explains():
    info = dcoco.build_info()
    assert dcoco.cuda_available() is (info["cuda_devices"] > 0 and info["built_with_cuda"])
    assert isinstance(info["cuda_status"], str) and info["cuda_status"]


@pytest.mark.skipif(os.environ.get("DCOCO_CUDA", "AUTO").upper() == "OFF", reason="built with DCOCO_CUDA=OFF")
def test_cuda_is_compiled_whenever_nvcc_exists():
    """CI has nvcc but no GPU: the CUDA sources must have been compiled (90a and 100a) all the same."""
    if shutil.which("nvcc") is None and not os.environ.get("CUDACXX"):
        assert not dcoco.build_info()["built_with_cuda"]
    else:
        info = dcoco.build_info()
        assert info["built_with_cuda"] and info["cutlass"].startswith("4.")


def test_prepared_bf16_module_matches_the_unprepared_one():
    case = make_case(4, 15, 16, 64, seed=3)
    m = case.corrector.bfloat16()
    plain = m(*case.inputs)
    m.prepare_inference(case.embed)
    prepared = m(*case.inputs)
    assert (prepared[0] == plain[0]).float().mean() > 0.99
    with torch.no_grad():
        m.mlp[2].weight.mul_(2.0)  # any weight, not only the tabulated ones, invalidates the preparation
    with pytest.warns(UserWarning, match="stale"):
        m(*case.inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_table_only_preparation_needs_no_embedding(dtype):
    """prepare_inference(embed, table_only=True): forward and score with embed=None equal the prepared calls with
    the embedding, the corrector keeps a one-element stand-in (the embedding can be freed), and a weight change
    afterwards is an error, not a silent fallback to the stand-in's zeros."""
    case = make_case(3, 7, 8, 64, dtype=dtype, seed=5)
    m = case.corrector
    with torch.no_grad():
        m.prepare_inference(case.embed)
        want, want_scores = m(*case.inputs), m.score(*case.inputs)
        m.prepare_inference(case.embed, table_only=True)
        got, got_scores = m(*case.inputs[:3]), m.score(*case.inputs[:3])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got_scores, want_scores, rtol=1e-5, atol=1e-5)
    assert m._stand_in.untyped_storage().nbytes() == m._stand_in.element_size()
    with pytest.raises(ValueError, match="embed: None reads the vocabulary table, which carries no gradient"):
        m.score(*case.inputs[:3])  # the parameters want a gradient here
    with torch.no_grad():
        m.pair_proj.weight.mul_(2.0)
    with pytest.raises(ValueError, match="stale"):
        m(*case.inputs[:3])
    with pytest.raises(ValueError, match="table_only=True"):
        m(*case.inputs[:3])
    with pytest.raises(TypeError, match="table_only"):
        m.prepare_inference(case.embed, table_only="yes")


@pytest.mark.parametrize("prepared", [False, True], ids=["embed", "table"])
def test_the_anchor_transition_off_is_the_paper_bit_for_bit(prepared):
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


def test_an_out_of_range_anchor_off_the_cpu_is_nan(monkeypatch):
    """Where a check would sync (CUDA, a compiled graph), the native path clamps the anchor's id and makes its
    logit NaN, as for any candidate: that block's S_0 is NaN and its walk keeps slot 1 at rank 0; the others are
    untouched."""
    if dcoco.get_backend() != "native":
        pytest.skip("the fused CPU core always checks (IndexError: tests/test_errors.py)")
    from dcoco.ops import native

    c = make_case(3, 5, 4, 64, V=200, seed=28, anchor=True)

    def first_and_ranks():
        with torch.no_grad():
            first = c.corrector.walk_inputs(c.corrector.score(*c.inputs, **c.kw), c.cand_logits)[0]
        return first, c.corrector(*c.inputs, **c.kw)[0]

    clean_first, clean_ranks = first_and_ranks()
    monkeypatch.setattr(native, "is_compiling", lambda: True)
    c.anchor_ids[1] = 200
    first, ranks = first_and_ranks()
    assert first[1].isnan().all() and ranks[1, 0] == 0
    keep = torch.tensor([0, 2])
    assert torch.equal(first[keep], clean_first[keep]) and torch.equal(ranks[keep], clean_ranks[keep])


@pytest.mark.parametrize("made_inside", ["embedding", "corrector", "both"])
def test_prepare_inference_under_inference_mode(made_inside):
    torch.manual_seed(2)
    inside = torch.inference_mode()
    with inside if made_inside in ("corrector", "both") else torch.no_grad():
        c = Corrector(D, 8, 16, 32)
        torch.nn.init.normal_(c.mlp[2].weight)
    with inside if made_inside in ("embedding", "both") else torch.no_grad():
        E = torch.randn(V, D)
    h, ids, lg = torch.randn(2, 4, D), torch.randint(0, V, (2, 4, 8)), torch.randn(2, 4, 8)
    want = c(h, ids, lg, E)[0]
    with torch.inference_mode():
        c.prepare_inference(E)
        assert torch.equal(c(h, ids, lg, E)[0], want)


def test_data_writes_are_the_documented_blind_spot_of_the_staleness_check():
    """`.data` writes bypass autograd's version counter, so the check cannot see them (docs/backends.md, "Documented
    edge cases"): the stale table stays in use until prepare_inference runs again, which then matches the unprepared
    result."""
    torch.manual_seed(3)
    c = Corrector(D, 8, 16, 32)
    torch.nn.init.normal_(c.mlp[2].weight)
    E, h = torch.randn(V, D), torch.randn(2, 4, D)
    ids, lg = torch.randint(0, V, (2, 4, 8)), torch.randn(2, 4, 8)
    with torch.no_grad():
        c.prepare_inference(E)
        c.cand_proj.weight.data.copy_(torch.randn_like(c.cand_proj.weight))  # behind the counter's back
        assert c.prepared  # not noticed
        fresh = Corrector(D, 8, 16, 32)
        fresh.load_state_dict(c.state_dict())
        want = fresh(h, ids, lg, E)[1]
        c.prepare_inference(E)
        assert torch.equal(c(h, ids, lg, E)[1], want)


def test_an_int64_anchor_is_never_narrowed_to_int32_candidates():
    """2^32 + 3 (int64) beside int32 cand_ids was cast to token 3; now it is checked as given, on both backends."""
    import dcoco

    torch.manual_seed(7)
    c = Corrector(D, 8, 16, 32, anchor_transition=True)
    E, h = torch.randn(V, D), torch.randn(2, 5, D)
    ids, lg = torch.randint(0, V, (2, 4, 8), dtype=torch.int32), torch.randn(2, 4, 8)
    for backend in ("fused", "native"):
        with dcoco.use_backend(backend), torch.no_grad():
            with pytest.raises(IndexError, match=rf"anchor_ids\[1\] = {2 ** 32 + 3} is outside \[0, V={V}\)"):
                c(h, ids, lg, E, anchor_ids=torch.tensor([3, 2 ** 32 + 3]))
            with pytest.raises(IndexError, match=r"anchor_ids\[0\] = -1 is outside"):
                c.score(h, ids, lg, E, anchor_ids=torch.tensor([-1, 3]))
            want = c(h, ids.long(), lg, E, anchor_ids=torch.tensor([3, 5]))
            got = c(h, ids, lg, E, anchor_ids=torch.tensor([3, 5], dtype=torch.int32))
            assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_anchor_corrector_refuses_an_empty_block_like_the_plain_one():
    E = torch.randn(V, D)
    for anchor, hidden in ((False, torch.randn(2, 0, D)), (True, torch.randn(2, 1, D))):
        c = Corrector(D, 8, 16, 32, anchor_transition=anchor)
        with pytest.raises(ValueError, match=r"hidden: expected at least one drafted slot \(B >= 1\), got B=0"):
            c(hidden, torch.zeros(2, 0, 8, dtype=torch.long), torch.zeros(2, 0, 8), E,
              anchor_ids=torch.tensor([1, 2]) if anchor else None)


def test_preparation_faults_are_named_or_handled():
    import warnings

    torch.manual_seed(8)
    c = Corrector(D, 8, 16, 32)
    torch.nn.init.normal_(c.mlp[2].weight)
    E, h = torch.randn(V, D), torch.randn(2, 4, D)
    ids, lg = torch.randint(0, V, (2, 4, 8)), torch.randn(2, 4, 8)
    with pytest.raises(TypeError, match="embed: expected a torch.Tensor, got NoneType"):
        c.prepare_inference(None)
    with torch.no_grad():
        want = c(h, ids, lg, E)
    with torch.inference_mode():  # prepared inside inference_mode, then again outside it
        c.prepare_inference(E)
    c.prepare_inference(E)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(c(h, ids, lg, E), want))
        c.prepare_inference(E, table_only=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same embedding again is not "stale"
            assert all(torch.equal(a, b) for a, b in zip(c(h, ids, lg, E), want))
        assert c.prepared and all(torch.equal(a, b) for a, b in zip(c(h, ids, lg), want))
    with pytest.raises(ValueError, match=r"embed: None reads the vocabulary table, which carries no gradient; "
                                         r"score under torch.no_grad\(\)"):
        c.score(h, ids, lg)
