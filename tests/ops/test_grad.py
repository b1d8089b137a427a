"""The backward of score + walk_inputs + correction_loss, what training runs, of the paper's corrector and, as a
parameter, with the anchor transition (its S_0 and the loss's anchor term): gradcheck in float64, and the float32
backward (the compiled one of cpp/cpu/grad.cpp on the fused backend, autograd on the native one) against autograd
through the literal reference; the compiled backward's contract: no gradient for embed or the ids, deterministic,
named errors."""

import pytest
import torch
from torch import nn

import dcoco
from dcoco.loss import correction_loss
from dcoco.ops import fused
from dcoco.testing import reference as ref

from helpers.cases import draw_labels, make_case

pytestmark = pytest.mark.usefixtures("each_backend")  # every test on both backends
ANCHOR = pytest.mark.parametrize("anchor", [False, True], ids=["paper", "anchor"])
PARAMS = ("cand_proj.weight", "ctx_proj.weight", "fuse_proj.weight", "fuse_norm.weight", "fuse_norm.bias",
          "pair_proj.weight", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias")  # fused.WEIGHTS' order


class Step(nn.Module):
    """score + walk_inputs + correction_loss (with the anchor term when the case has one), as a function of the
    inputs and of the corrector's parameters (torch.func.functional_call substitutes them)."""

    def __init__(self, case, target, valid):
        super().__init__()
        self.m, self.case, self.target, self.valid = case.corrector, case, target, valid

    def forward(self, hidden, logits):
        c = self.case
        first, grid = self.m.walk_inputs(self.m.score(hidden, c.cand_ids, logits, c.embed, **c.kw), logits)
        anchor_scores = first if c.anchor_ids is not None else None
        return first, grid, correction_loss(grid, c.cand_ids, self.target, self.valid, anchor_scores=anchor_scores)


@ANCHOR
@pytest.mark.parametrize("R,B,K,d,fast", [(1, 2, 1, 3, False), (2, 4, 3, 8, True), (3, 3, 5, 6, True)])
def test_gradcheck_float64(R, B, K, d, fast, anchor):
    """Every parameter active (random output layer, LayerNorm affine away from 1/0)."""
    c = make_case(R, B, K, d, V=4 * K + 7, seed=R + B + K, r=4, H=5, anchor=anchor)
    c.corrector.double()
    c.embed = c.embed.double()
    target, valid = draw_labels(c.cand_ids, torch.Generator().manual_seed(1), absent=0.1, invalid=0.1)
    step = Step(c, target, valid)
    hidden = c.hidden.double().requires_grad_()
    logits = c.cand_logits.double().requires_grad_()
    weights = [w.detach().clone().requires_grad_() for w in c.corrector.weights()]

    def f(h, lg, *ws):
        return torch.func.functional_call(step, {f"m.{n}": w for n, w in zip(PARAMS, ws)}, (h, lg))

    first, _, loss = f(hidden, logits, *weights)
    assert first.dtype == torch.float64 and (loss.item() != 0.0 or K == 1)  # supervised (K = 1: log 1 = 0)
    # fast mode checks random projections of the Jacobian: the same check, far fewer calls
    assert torch.autograd.gradcheck(f, (hidden, logits, *weights), eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=fast)
    if anchor:  # the anchor's hidden state counts
        assert (torch.autograd.grad(f(hidden, logits, *weights)[0].sum(), hidden)[0][:, 0] != 0).any()


def reference_grads(c, G0, G, target, valid):
    """Gradients of sum(first G0) + sum(grid G) + the loss by autograd through the literal reference, in float64."""
    h = c.hidden.double().requires_grad_()
    lg = c.cand_logits.double().requires_grad_()
    ws = [w.detach().double().requires_grad_() for w in c.corrector.weights()]
    E = c.embed.double()
    if c.anchor_ids is None:
        first, grid, anchor_scores = lg[:, 0], ref.score(h, c.cand_ids, lg, E, *ws), None
    else:
        first = anchor_scores = ref.anchor_scores(h, c.cand_ids, lg, c.anchor_ids, E, *ws)
        grid = ref.score(h[:, 1:], c.cand_ids, lg, E, *ws)
    ((first * G0).sum() + (grid * G).sum() + correction_loss(grid, c.cand_ids, target, valid,
                                                             anchor_scores=anchor_scores)).backward()
    return [h.grad, lg.grad, *(w.grad for w in ws)]


def backward(c, G0, G, target, valid):
    """Gradients of sum(first G0) + sum(grid G) + the loss through dcoco, in (hidden, cand_logits, *weights) order."""
    c.corrector.zero_grad()
    h = c.hidden.clone().requires_grad_()
    lg = c.cand_logits.clone().requires_grad_()
    first, grid, loss = Step(c, target, valid)(h, lg)
    ((first * G0).sum() + (grid * G).sum() + loss).backward()
    return [h.grad, lg.grad, *(w.grad.clone() for w in c.corrector.weights())]


def cotangents(c, seed):
    g = torch.Generator().manual_seed(seed)
    R, B, K = c.cand_ids.shape
    return (torch.randn(R, K, generator=g), torch.randn(R, B - 1, K, K, generator=g), *draw_labels(c.cand_ids, g))


@ANCHOR
@pytest.mark.parametrize("R,B,K,d,dtype", [
    (1, 15, 16, 64, torch.float32),
    (3, 15, 16, 256, torch.bfloat16),
    (2, 5, 4, 576, torch.float16),
    (4, 2, 1, 96, torch.float32),
])
def test_float32_grads_match_autograd_through_the_reference(R, B, K, d, dtype, anchor):
    c = make_case(R, B, K, d, dtype=dtype, seed=R + B + d, anchor=anchor)
    args = cotangents(c, 1)
    ours = backward(c, *args)
    for name, got, want in zip(("hidden", "cand_logits", *fused.WEIGHTS), ours, reference_grads(c, *args)):
        assert got.dtype == (dtype if name in ("hidden", "cand_logits") else torch.float32), name
        scale = want.abs().max().item() + 1e-30
        tol = 1e-2 if got.dtype != torch.float32 else 2e-5  # 16-bit grads are rounded to their dtype
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * scale, msg=name)
    if anchor:
        assert (ours[0][:, 0] != 0).any()  # the anchor's hidden state gets its gradient


@pytest.mark.fused_only  # compares the two backends itself
@ANCHOR
@pytest.mark.parametrize("R,B,K,d", [(2, 15, 16, 64), (4, 3, 5, 128)])
def test_the_compiled_backward_agrees_with_native_autograd(R, B, K, d, anchor):
    c = make_case(R, B, K, d, seed=R * B + d, anchor=anchor)
    args = cotangents(c, 4)
    grads = {}
    for name in ("fused", "native"):
        with dcoco.use_backend(name):
            grads[name] = backward(c, *args)
    for name, got, want in zip(("hidden", "cand_logits", *fused.WEIGHTS), grads["fused"], grads["native"]):
        atol = 2e-5 * want.abs().max().item()
        if name == "mlp2_bias":  # a sum over every cell: float32 rounds it to about eps x the L1 of its terms
            atol = 2 ** -23 * (args[0].abs().sum() + args[1].abs().sum()).item()
        torch.testing.assert_close(got, want, rtol=2e-5, atol=atol, msg=name)


@ANCHOR
def test_the_training_graph_compiles_fullgraph(anchor):
    """fullgraph=True fails on any graph break: score with its backward through walk_inputs and the loss in one
    graph (aot_eager: Dynamo and AOT autograd, without inductor's C++ builds), equal to the eager gradients."""
    c = make_case(3, 6, 16, 64, V=200, seed=27, anchor=anchor)
    _, _, target, valid = cotangents(c, 5)
    step = Step(c, target, valid)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    grads = []
    for f in (compiled, step):
        h = c.hidden.clone().requires_grad_()
        f(h, c.cand_logits)[2].backward()
        grads.append(h.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_no_gradient_for_embed_or_ids():
    c = make_case(2, 4, 3, 32)
    embed = c.embed.clone().requires_grad_()
    h = c.hidden.clone().requires_grad_()
    c.corrector.score(h, c.cand_ids, c.cand_logits, embed).sum().backward()
    assert embed.grad is None and h.grad is not None


def test_single_slot_has_zero_gradients():
    c = make_case(2, 1, 3, 32)
    h = c.hidden.clone().requires_grad_()
    s = c.corrector.score(h, c.cand_ids, c.cand_logits, c.embed)
    assert s.shape == (2, 0, 3, 3)
    s.sum().backward()
    assert torch.equal(h.grad, torch.zeros_like(h))


@pytest.mark.fused_only
def test_backward_is_deterministic_across_thread_counts():
    c = make_case(3, 15, 16, 128, seed=4)
    G = torch.randn(3, 14, 16, 16)
    args = (G, *c.inputs, *c.corrector.weights())
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.dcoco.score_backward(*args)
        torch.set_num_threads(max(2, threads))
        many = torch.ops.dcoco.score_backward(*args)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, many))


@pytest.mark.fused_only
def test_bad_gradient_is_named():
    c = make_case(2, 4, 3, 32)
    with pytest.raises(ValueError, match=r"grad: expected shape \(2, 3, 3, 3\)"):
        torch.ops.dcoco.score_backward(torch.randn(2, 3, 3, 2), *c.inputs, *c.corrector.weights())
    with pytest.raises(TypeError, match="grad: expected float32"):
        torch.ops.dcoco.score_backward(torch.zeros(2, 3, 3, 3, dtype=torch.int32), *c.inputs, *c.corrector.weights())


@pytest.mark.fused_only
def test_score_backward_passes_opcheck():
    c = make_case(2, 3, 2, 16)
    args = (*c.inputs, *(w.detach().requires_grad_() for w in c.corrector.weights()))
    torch.library.opcheck(torch.ops.dcoco.score, args)
    weights = [w.detach() for w in c.corrector.weights()]  # no double backward: nothing requires grad here
    torch.library.opcheck(torch.ops.dcoco.score_backward, (torch.randn(2, 2, 2, 2), *c.inputs, *weights))


def test_training_step_moves_the_walk_towards_labels():
    """A few SGD steps on L_corr through the compiled op raise the label transition's score."""
    c = make_case(2, 6, 4, 32, seed=3)
    opt = torch.optim.SGD(c.corrector.parameters(), lr=0.05)
    target = c.cand_ids[:, :, -1]  # the last-ranked candidate everywhere
    valid = torch.ones(2, 6, dtype=torch.bool)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = dcoco.correction_loss(c.corrector.score(*c.inputs), c.cand_ids, target, valid)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.fused_only  # native: autograd's own double backward
def test_double_backward_says_it_is_unsupported():
    c = make_case(2, 3, 2, 16)
    h = c.hidden.clone().requires_grad_()
    (g,) = torch.autograd.grad(c.corrector.score(h, *c.inputs[1:]).sum(), h, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        g.sum().backward()
