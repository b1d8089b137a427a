"""The compiled backward of dcoco::score (cpp/cpu/grad.cpp) against autograd through the literal reference,
gradcheck in float64, and its contract: no gradient for embed or the ids, deterministic, named errors."""

import pytest
import torch

import dcoco
from dcoco.ops import fused
from dcoco.testing import reference as ref

from helpers.cases import backend_score, make_case

pytestmark = pytest.mark.usefixtures("each_backend")  # every test on both backends


def small_case(R, B, K, d, dtype=torch.float64, seed=0):
    """Every parameter active (random output layer, LayerNorm affine away from 1/0)."""
    c = make_case(R, B, K, d, V=4 * K + 7, seed=seed, r=4, H=5)
    c.corrector.to(dtype)
    return c


@pytest.mark.parametrize("R,B,K,d,fast", [(1, 2, 1, 3, False), (2, 4, 3, 8, True), (3, 3, 5, 6, True)])
def test_gradcheck_float64(R, B, K, d, fast):
    c = small_case(R, B, K, d)
    hidden = c.hidden.double().requires_grad_()
    logits = c.cand_logits.double().requires_grad_()
    weights = [w.detach().clone().requires_grad_() for w in c.corrector.weights()]
    embed = c.embed.double()

    def f(h, lg, *ws):
        return backend_score(h, c.cand_ids, lg, embed, ws)

    # fast mode checks random projections of the Jacobian: the same check, far fewer calls
    assert torch.autograd.gradcheck(f, (hidden, logits, *weights), eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=fast)


def reference_grads(c, G):
    """Gradients of sum(S * G) by autograd through dcoco.testing.reference, in float64."""
    h = c.hidden.double().requires_grad_()
    lg = c.cand_logits.double().requires_grad_()
    ws = [w.detach().double().requires_grad_() for w in c.corrector.weights()]
    (ref.score(h, c.cand_ids, lg, c.embed.double(), *ws) * G.double()).sum().backward()
    return [h.grad, lg.grad, *(w.grad for w in ws)]


@pytest.mark.parametrize("R,B,K,d,dtype", [
    (1, 15, 16, 64, torch.float32),
    (3, 15, 16, 256, torch.bfloat16),
    (2, 5, 4, 576, torch.float16),
    (4, 2, 1, 96, torch.float32),
])
def test_float32_grads_match_autograd_through_the_reference(R, B, K, d, dtype):
    c = make_case(R, B, K, d, dtype=dtype, seed=R + B + d)
    G = torch.randn(R, B - 1, K, K, generator=torch.Generator().manual_seed(1))
    h = c.hidden.clone().requires_grad_()
    lg = c.cand_logits.clone().requires_grad_()
    (c.corrector.score(h, c.cand_ids, lg, c.embed) * G).sum().backward()
    ours = [h.grad, lg.grad, *(w.grad for w in c.corrector.weights())]
    for name, got, want in zip(("hidden", "cand_logits", *fused.WEIGHTS), ours, reference_grads(c, G)):
        assert got.dtype == (dtype if name in ("hidden", "cand_logits") else torch.float32), name
        scale = want.abs().max().item() + 1e-30
        tol = 1e-2 if got.dtype != torch.float32 else 2e-5  # 16-bit grads are rounded to their dtype
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * scale, msg=name)


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
