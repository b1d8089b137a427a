"""Bad input raises a clear Python exception naming the argument; never a crash, never garbage."""

import math
import re

import pytest
import torch

import dcoco
from dcoco.ops import native

from helpers.cases import make_case

pytestmark = pytest.mark.usefixtures("each_backend")  # every test on both backends


@pytest.fixture(scope="module")
def case():
    return make_case(2, 5, 4, 64, V=50, seed=1)


def call_score(case, **over):
    args = dict(zip(("hidden", "cand_ids", "cand_logits", "embed"), case.inputs))
    args.update(over)
    return case.corrector.score(**args)


def call_forward(case, **over):
    args = dict(zip(("hidden", "cand_ids", "cand_logits", "embed"), case.inputs))
    args.update(over)
    return case.corrector(**args)


BAD = [
    # (name, override builder, exception, message fragment)
    ("hidden rank", lambda c: dict(hidden=c.hidden[0]), ValueError, "hidden: expected 3 dimensions"),
    ("hidden int dtype", lambda c: dict(hidden=c.hidden.long()), TypeError, "hidden: expected float32"),
    ("hidden not a tensor", lambda c: dict(hidden=c.hidden.tolist()), TypeError, "hidden: expected a torch.Tensor"),
    ("float ids", lambda c: dict(cand_ids=c.cand_ids.float()), TypeError, "cand_ids: expected int32 or int64"),
    ("int16 ids", lambda c: dict(cand_ids=c.cand_ids.short()), TypeError, "cand_ids: expected int32 or int64"),
    ("ids rank", lambda c: dict(cand_ids=c.cand_ids[..., 0]), ValueError, "cand_ids: expected 3 dimensions"),
    ("R mismatch", lambda c: dict(cand_ids=c.cand_ids[:1]), ValueError, "cand_ids: expected shape (2, 5, 4)"),
    ("B mismatch", lambda c: dict(cand_ids=c.cand_ids[:, :3], cand_logits=c.cand_logits[:, :3]), ValueError,
     "cand_ids: expected shape (2, 5, 4)"),
    ("K mismatch", lambda c: dict(cand_logits=c.cand_logits[..., :3]), ValueError,
     "cand_logits: expected shape (2, 5, 4)"),
    ("d mismatch", lambda c: dict(embed=c.embed[:, :32]), ValueError, "embed: expected shape (50, 64)"),
    ("hidden d vs weights", lambda c: dict(hidden=c.hidden[..., :32], embed=c.embed[:, :32]), ValueError,
     "cand_proj: expected shape (128, 32)"),
    ("embed rank", lambda c: dict(embed=c.embed[None]), ValueError, "embed: expected 2 dimensions"),
    ("logits int", lambda c: dict(cand_logits=c.cand_logits.long()), TypeError, "cand_logits: expected float32"),
    ("id too large", lambda c: dict(cand_ids=c.cand_ids.clone().index_put_(
        (torch.tensor(1), torch.tensor(3), torch.tensor(2)), torch.tensor(50))),
     IndexError, "cand_ids[1, 3, 2] = 50 is outside [0, V=50)"),
    ("negative id", lambda c: dict(cand_ids=c.cand_ids.clone().fill_(-1)), IndexError, "cand_ids[0, 0, 0] = -1"),
    ("meta and cpu mixed", lambda c: dict(embed=c.embed.to("meta")), ValueError, "embed: expected device cpu"),
    ("B = 0", lambda c: dict(hidden=c.hidden[:, :0], cand_ids=c.cand_ids[:, :0], cand_logits=c.cand_logits[:, :0]),
     ValueError, "at least one drafted slot"),
]


@pytest.mark.parametrize("name,build,exc,msg", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("call", [call_score, call_forward], ids=["score", "forward"])
def test_bad_input_is_named(case, call, name, build, exc, msg):
    with pytest.raises(exc, match=re.escape(msg)):
        call(case, **build(case))


def test_float64_is_the_training_paths_only(case):
    with pytest.raises(TypeError, match="hidden: expected float32, bfloat16 or float16, got torch.float64"):
        call_forward(case, hidden=case.hidden.double())
    assert call_score(case, hidden=case.hidden.double()).dtype == torch.float64  # gradcheck's path


def test_more_candidates_than_the_compiled_maximum():
    K = dcoco.MAX_CANDIDATES + 1
    c = make_case(1, 3, 4, 64, V=200, seed=2)
    ids = torch.arange(3 * K).view(1, 3, K)
    logits = torch.randn(1, 3, K)
    with pytest.raises(ValueError, match=f"cand_ids: expected 1 <= K <= {dcoco.MAX_CANDIDATES}"):
        c.corrector.score(c.hidden, ids, logits, c.embed)
    with pytest.raises(ValueError, match="num_candidates: at most"):
        dcoco.Corrector(64, num_candidates=K)


@pytest.mark.parametrize("kw,exc,msg", [(dict(hidden_size=0), ValueError, "hidden_size"),
                                        (dict(hidden_size=64, width=1), ValueError, "width"),
                                        (dict(hidden_size=64, mlp_hidden=0), ValueError, "mlp_hidden"),
                                        (dict(hidden_size=64.0), ValueError, "hidden_size"),
                                        (dict(hidden_size=64, anchor_transition=1), TypeError,
                                         "anchor_transition: expected a bool")])
def test_bad_corrector_configuration(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        dcoco.Corrector(**kw)


BAD_ANCHOR = [
    # (name, call on an anchor case c, exception, message pattern)
    ("missing", lambda c: c.corrector(*c.inputs), ValueError, "anchor_ids: the anchor transition is on"),
    ("missing in score", lambda c: c.corrector.score(*c.inputs), ValueError, "anchor_ids: the anchor transition is on"),
    ("given when off", lambda c: c.plain(c.hidden[:, 1:], *c.inputs[1:], **c.kw), ValueError,
     "anchor_ids: this corrector has no anchor transition"),
    ("given when off, score", lambda c: c.plain.score(c.hidden[:, 1:], *c.inputs[1:], **c.kw), ValueError,
     "anchor_ids: this corrector has no anchor transition"),
    ("a list", lambda c: c.corrector(*c.inputs, anchor_ids=c.anchor_ids.tolist()), TypeError,
     "anchor_ids: expected a torch.Tensor"),
    ("float", lambda c: c.corrector(*c.inputs, anchor_ids=c.anchor_ids.float()), TypeError,
     "anchor_ids: expected int32 or int64"),
    ("bool", lambda c: c.corrector.score(*c.inputs, anchor_ids=c.anchor_ids > 0), TypeError,
     "anchor_ids: expected int32 or int64"),
    ("(R,1)", lambda c: c.corrector(*c.inputs, anchor_ids=c.anchor_ids[:, None]), ValueError,
     r"anchor_ids: expected .*\(2,\)"),
    ("(R+1,)", lambda c: c.corrector.score(*c.inputs, anchor_ids=torch.cat([c.anchor_ids, c.anchor_ids])),
     ValueError, r"anchor_ids: expected .*\(2,\)"),
    ("device", lambda c: c.corrector(*c.inputs, anchor_ids=c.anchor_ids.to("meta")), ValueError,
     "anchor_ids: expected .* on cpu"),
    ("hidden (R,B,d)", lambda c: c.corrector(c.hidden[:, 1:], *c.inputs[1:], **c.kw), ValueError,
     r"hidden: .*\(R,B\+1,d\)"),
    ("hidden (R,B+2,d)", lambda c: c.corrector.score(torch.cat([c.hidden, c.hidden[:, :1]], 1), *c.inputs[1:],
                                                     **c.kw), ValueError, r"hidden: .*\(R,B\+1,d\)"),
    ("hidden 2-D", lambda c: c.corrector(c.hidden[0], *c.inputs[1:], **c.kw), ValueError, "hidden: "),
    ("cand_ids 2-D", lambda c: c.corrector(c.hidden, c.cand_ids[0], *c.inputs[2:], **c.kw), ValueError,
     "cand_ids: expected 3 dimensions"),
    ("anchor id out of range", lambda c: c.corrector(*c.inputs, anchor_ids=torch.tensor([3, 200])), IndexError,
     r"anchor_ids\[1\] = 200 is outside \[0, V=200\)"),
]


@pytest.mark.parametrize("name,call,exc,msg", BAD_ANCHOR, ids=[b[0] for b in BAD_ANCHOR])
def test_bad_anchor_input_is_named(name, call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(make_case(2, 4, 3, 32, V=200, seed=25, anchor=True))


def test_cuda_tensors_without_a_cuda_kernel_raise_clearly(case):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: covered by bench/gpu_check.sh")
    # no device here: torch itself refuses to make CUDA tensors, which is the clear error users see
    with pytest.raises((RuntimeError, AssertionError)):
        call_score(case, hidden=case.hidden.cuda())


def test_nan_and_inf_logits_are_documented_behaviour(case):
    """NaN/Inf flow through the scores as IEEE arithmetic (as in the reference); the walk never picks a
    NaN score over a number and returns valid ranks whatever the input."""
    logits = case.cand_logits.clone()
    logits[0, 2, 1] = float("nan")
    logits[1, 1, 0] = float("inf")
    logits[1, 3, 2] = float("-inf")
    scores = call_score(case, cand_logits=logits)
    assert scores[0, 1, :, 1].isnan().all() and scores[0, 2, 1].isnan().all()  # as successor, as predecessor
    assert not scores[0, 0].isnan().any()
    ranks, tokens = call_forward(case, cand_logits=logits)
    assert ((ranks >= 0) & (ranks < 4)).all()
    assert ranks[0, 2] != 1  # the NaN candidate is never chosen over a number
    assert torch.equal(tokens, torch.gather(case.cand_ids.long(), 2, ranks[..., None])[..., 0])


@pytest.mark.parametrize("args,exc,msg", [
    ((torch.randn(2, 3, 4, 5), torch.randn(2, 4), "greedy"), ValueError, "scores: expected shape"),
    ((torch.randn(2, 3, 4, 4), torch.randn(2, 5), "greedy"), ValueError, "first_logits: expected shape"),
    ((torch.randn(2, 3, 4, 4), torch.randn(2, 4), "beam"), ValueError, "rule: expected one of"),
    ((torch.randn(2, 3, 4, 4), torch.randn(2, 4), "geometric", -0.5), ValueError, "lam: expected a finite"),
    ((torch.randn(2, 3, 4, 4), torch.randn(2, 4), "geometric", math.nan), ValueError, "lam: expected a finite"),
    ((torch.randn(2, 3, 4, 4).long(), torch.randn(2, 4), "greedy"), TypeError, "scores: expected float32"),
])
def test_select_bad_input(args, exc, msg):
    with pytest.raises(exc, match=msg):
        dcoco.select(*args)


def test_wrong_table_shape_is_named(case, each_backend):
    bad = torch.zeros(49, 128)
    with pytest.raises(ValueError, match=re.escape("table: expected shape (50, 128)")):
        if each_backend == "native":
            native.correct(*case.inputs, case.corrector.weights(), bad)
        else:
            torch.ops.dcoco.correct(*case.inputs, *case.corrector.weights(), bad)
