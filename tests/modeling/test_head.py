"""The chunked LM-head pass of training (dcoco.modeling.head): cross-entropy, top-K and gradients equal the full-logits
computation for any chunk size, and with several chunks no (rows, V) tensor is kept for backward."""

import pytest
import torch
import torch.nn.functional as F

from dcoco.modeling.dflash import decayed_mean, dflash_loss
from dcoco.modeling.head import chunk_rows, shortlist_ce, topk_ce


def _inputs(dtype, R=5, B=7, d=32, V=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(R, B, d, generator=g).to(dtype).requires_grad_()
    W = torch.randn(V, d, generator=g).to(dtype)
    labels = torch.randint(0, V, (R, B), generator=g)
    valid = torch.rand(R, B, generator=g) > 0.3
    return h, W, labels, valid


def _objective(ce, values, valid):  # the DFlash loss plus something that reads the top-K values (as L_corr does)
    return decayed_mean(ce, valid, 7.0) + values.float().square().mean()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [None, 1, 4, 7, 35, 1000])
def test_chunks_equal_the_full_logits(dtype, tol, rows):
    h, W, labels, valid = _inputs(dtype)
    ce, values, ids = topk_ce(h, W, labels, 16, rows)
    g, = torch.autograd.grad(_objective(ce, values, valid), h)
    logits = F.linear(h, W)
    top = logits.topk(16, dim=-1)
    ref = dflash_loss(logits, labels, valid, 7.0) + top.values.float().square().mean()
    g_ref, = torch.autograd.grad(ref, h)
    assert ce.dtype == torch.float32 and values.dtype == dtype and ids.shape == (5, 7, 16)
    torch.testing.assert_close(_objective(ce, values, valid), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(values, top.values, rtol=tol, atol=tol)
    if dtype == torch.float32:  # bf16 matmuls blocked differently may swap near-ties
        assert torch.equal(ids, top.indices)
    torch.testing.assert_close(g.float(), g_ref.float(), rtol=tol, atol=tol)


def test_several_chunks_keep_no_full_logits_for_backward():
    h, W, labels, valid = _inputs(torch.float32, R=8, B=7, V=1000)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ce, values, _ = topk_ce(h, W, labels, 16, rows=8)
    _objective(ce, values, valid).backward()
    rows, V = 8 * 7, 1000
    assert saved and max(saved) < rows * V  # the head (V,d) and per-chunk tensors, never the (rows,V) logits
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        topk_ce(h, W, labels, 16, rows=rows)  # one chunk: logits kept, nothing recomputed
    assert rows * V in saved


def test_no_grad_labels_none_and_bad_arguments():
    h, W, labels, _ = _inputs(torch.float32)
    with torch.no_grad():
        ce, values, ids = topk_ce(h, W, None, 3, rows=2)
    assert ce is None and values.shape == ids.shape == (5, 7, 3)
    assert chunk_rows(151936) == 441 and chunk_rows(10, 3) == 3
    with pytest.raises(ValueError, match="rows"):
        chunk_rows(10, 0)
    with pytest.raises(ValueError, match="hidden"):
        topk_ce(h[..., :5], W, labels, 3)
    with pytest.raises(ValueError, match="labels"):
        topk_ce(h, W, labels + 1000, 3)
    with pytest.raises(ValueError, match="labels"):
        topk_ce(h, W, labels[:2], 3)
    with pytest.raises(ValueError, match="k"):
        topk_ce(h, W, labels, 0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_shortlist_is_the_softmax_over_its_candidates(dtype, tol):
    h, W, labels, valid = _inputs(dtype)
    vocab = torch.randperm(300, generator=torch.Generator().manual_seed(1))[:40]
    ce, values, ids = shortlist_ce(h, W, labels, vocab, 16)
    g, = torch.autograd.grad(_objective(ce, values, valid), h)
    cand = sorted(set(vocab.tolist()) | set(labels.flatten().tolist()))  # the literal candidate set
    logits = F.linear(h, W)
    outside = torch.ones(300, dtype=torch.bool)
    outside[cand] = False
    masked = logits.masked_fill(outside, -1e4)  # the full softmax with every other token removed (exp underflows)
    top = masked.topk(16, dim=-1)
    ref = dflash_loss(masked, labels, valid, 7.0) + top.values.float().square().mean()
    g_ref, = torch.autograd.grad(ref, h)
    torch.testing.assert_close(_objective(ce, values, valid), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(values, top.values, rtol=tol, atol=tol)
    if dtype == torch.float32:
        assert torch.equal(ids, top.indices)
    torch.testing.assert_close(g.float(), g_ref.float(), rtol=tol, atol=tol)
    whole, *_ = shortlist_ce(h, W, labels, torch.arange(300), 16)  # the whole vocabulary: topk_ce's loss
    torch.testing.assert_close(whole, topk_ce(h, W, labels, 16)[0], rtol=tol, atol=tol)


def test_shortlist_bad_arguments():
    h, W, labels, _ = _inputs(torch.float32)
    with pytest.raises(ValueError, match="hidden"):
        shortlist_ce(h[..., :8], W, labels, torch.arange(10), 4)
    with pytest.raises(ValueError, match="labels"):
        shortlist_ce(h, W, labels[:, :3], torch.arange(10), 4)
    with pytest.raises(ValueError, match="k"):
        shortlist_ce(h[:1, :1], W, labels[:1, :1], torch.arange(2), 4)
    with pytest.raises(ValueError, match="vocab"):
        shortlist_ce(h, W, labels, torch.tensor([300]), 4)


def _teacher(labels, n=6, V=300, seed=2):
    """A random distribution over n distinct tokens per row (float32 probabilities summing to 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(*labels.shape, V, generator=g).argsort(-1)[..., :n]
    return ids, torch.rand(*labels.shape, n, generator=g).softmax(-1)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [None, 4, 35])
def test_teacher_replaces_the_one_hot_target(dtype, tol, rows):
    h, W, labels, valid = _inputs(dtype)
    ids, p = _teacher(labels)
    ce, values, top = topk_ce(h, W, labels, 16, rows, teacher=(ids, p))
    g, = torch.autograd.grad(decayed_mean(ce, valid, 7.0), h)  # the top-K's own gradient: the tests above
    logp = F.linear(h, W).float().log_softmax(-1)
    ref_ce = -(p * logp.gather(-1, ids)).sum(-1)  # the literal cross-entropy against the teacher
    g_ref, = torch.autograd.grad(decayed_mean(ref_ce, valid, 7.0), h)
    torch.testing.assert_close(ce, ref_ce, rtol=tol, atol=tol)
    torch.testing.assert_close(g.float(), g_ref.float(), rtol=tol, atol=tol)
    one_hot = (labels[..., None], torch.ones(*labels.shape, 1))  # a teacher sure of the label is plain CE
    torch.testing.assert_close(topk_ce(h, W, labels, 16, rows, teacher=one_hot)[0], topk_ce(h, W, labels, 16, rows)[0],
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_shortlist_takes_the_teachers_tokens_into_its_candidates(dtype, tol):
    h, W, labels, valid = _inputs(dtype)
    ids, p = _teacher(labels)
    vocab = torch.randperm(300, generator=torch.Generator().manual_seed(1))[:40]
    ce, values, top = shortlist_ce(h, W, labels, vocab, 16, teacher=(ids, p))
    g, = torch.autograd.grad(decayed_mean(ce, valid, 7.0), h)
    cand = sorted(set(vocab.tolist()) | set(labels.flatten().tolist()) | set(ids.flatten().tolist()))
    outside = torch.ones(300, dtype=torch.bool)
    outside[cand] = False
    masked = F.linear(h, W).masked_fill(outside, -1e4)
    ref_ce = -(p * masked.float().log_softmax(-1).gather(-1, ids)).sum(-1)
    g_ref, = torch.autograd.grad(decayed_mean(ref_ce, valid, 7.0), h)
    torch.testing.assert_close(ce, ref_ce, rtol=tol, atol=tol)
    torch.testing.assert_close(values, masked.topk(16, dim=-1).values, rtol=tol, atol=tol)
    torch.testing.assert_close(g.float(), g_ref.float(), rtol=tol, atol=tol)


def test_teacher_bad_arguments():
    h, W, labels, _ = _inputs(torch.float32)
    ids, p = _teacher(labels)
    with pytest.raises(ValueError, match="teacher ids: must lie"):
        topk_ce(h, W, labels, 4, teacher=(ids + 300, p))
    with pytest.raises(ValueError, match="teacher ids: expected shape"):
        shortlist_ce(h, W, labels, torch.arange(10), 4, teacher=(ids[:2], p[:2]))
    with pytest.raises(ValueError, match="teacher p: expected shape"):
        topk_ce(h, W, labels, 4, teacher=(ids, p[..., :2]))
    with pytest.raises(ValueError, match="teacher: replaces"):
        topk_ce(h, W, None, 4, teacher=(ids, p))
