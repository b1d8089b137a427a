"""Microbenchmarks of the corrector (pytest-benchmark), side by side in one run: the forward on the CPU
always and on CUDA when a device is visible (the `cuda` groups; CUDA timings synchronise after every call);
the training op (score and its compiled backward) on the CPU.

  python -m pytest bench/bench_ops.py --benchmark-only --benchmark-json bench/results/cpu/cpu.json
  python bench/summarize.py bench/results/cpu/cpu.json  # the tables of bench/results/cpu/README.md

Groups R=1, 8, 32 (d=4096, B=15, K=16, V=151936, bf16 inputs), each with: the fused forward with and
without the prepared vocabulary table, the native backend (dcoco.ops.native: the same rewrites in plain PyTorch)
with and without the same table, and the literal reference (dcoco.testing.reference, materialised 386-wide MLP
inputs). Groups "train R=1, 8, 32": dcoco::score forward, its backward (score_backward) alone, forward +
backward through autograd, against the native score forward and forward + backward (autograd, chunks
recomputed)."""

import pytest
import torch

import dcoco
from dcoco.ops import native
from dcoco.testing import reference as ref

D, V, B, K = 4096, 151936, 15, 16


@pytest.fixture(scope="module")
def model():
    g = torch.Generator().manual_seed(0)
    m = dcoco.Corrector(D)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    embed = torch.randn(V, D, generator=g).bfloat16()
    table = m.prepare_inference(embed)
    return m, embed, table


def inputs(R):
    g = torch.Generator().manual_seed(R)
    hidden = torch.randn(R, B, D, generator=g).bfloat16()
    ids = torch.randint(0, V, (R, B, K), generator=g)
    logits = torch.randn(R, B, K, generator=g).sort(-1, descending=True).values.bfloat16()
    return hidden, ids, logits


@pytest.fixture(autouse=True)
def fused_kernel():
    """The dcoco_* rows time the fused kernel on every device, validated or not (the raw ops ask the backend)."""
    with dcoco.use_backend("fused"):
        yield


IMPLS = ["dcoco_table", "dcoco", "native_table", "native", "reference"]
DEVICES = ["cpu"] + (["cuda"] if dcoco.cuda_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("R", [1, 8, 32])
@pytest.mark.parametrize("impl", IMPLS)
def test_forward(benchmark, model, impl, R, device):
    m, embed, table = model
    hidden, ids, logits = inputs(R)
    w = tuple(t.detach() for t in m.weights())
    if device == "cuda":
        hidden, ids, logits, embed, table = (t.cuda() for t in (hidden, ids, logits, embed, table))
        w = tuple(t.cuda() for t in w)
    benchmark.group = f"forward R={R}" + ("" if device == "cpu" else " cuda")
    benchmark.extra_info.update(R=R, d=D, B=B, K=K, V=V, impl=impl, device=device, threads=torch.get_num_threads())
    if impl == "dcoco_table":
        fn = lambda: torch.ops.dcoco.correct(hidden, ids, logits, embed, *w, table)
    elif impl == "dcoco":
        fn = lambda: torch.ops.dcoco.correct(hidden, ids, logits, embed, *w, None)
    elif impl == "native_table":
        fn = lambda: native.correct(hidden, ids, logits, embed, w, table)
    elif impl == "native":
        fn = lambda: native.correct(hidden, ids, logits, embed, w)
    else:
        fn = lambda: ref.forward(hidden, ids, logits, embed, *w)
    with torch.no_grad():
        want = torch.ops.dcoco.correct(hidden, ids, logits, embed, *w, table)[0]
        got = fn()[0]
        assert (got == want).float().mean() > 0.98  # same walk (up to near ties) before timing it
        rounds = 3 if impl == "reference" else 15
        timed = fn if device == "cpu" else lambda: (fn(), torch.cuda.synchronize())
        benchmark.pedantic(timed, rounds=rounds, warmup_rounds=1)


TRAIN_IMPLS = ["dcoco_forward", "dcoco_backward", "dcoco_forward_backward", "native_forward",
               "native_forward_backward"]


@pytest.mark.parametrize("R", [1, 8, 32])
@pytest.mark.parametrize("impl", TRAIN_IMPLS)
def test_train(benchmark, model, impl, R):
    m, embed, _ = model
    hidden, ids, logits = inputs(R)
    hidden, logits = hidden.float().requires_grad_(), logits.float().requires_grad_()
    w = tuple(t.detach().requires_grad_() for t in m.weights())
    G = torch.randn(R, B - 1, K, K, generator=torch.Generator().manual_seed(R))
    benchmark.group = f"train R={R}"
    benchmark.extra_info.update(R=R, d=D, B=B, K=K, V=V, impl=impl, device="cpu", threads=torch.get_num_threads())
    dcoco_score = lambda: torch.ops.dcoco.score(hidden, ids, logits, embed, *w)
    native_score = lambda: native.score(hidden, ids, logits, embed, w)
    with torch.no_grad():
        torch.testing.assert_close(dcoco_score(), native_score(), rtol=1e-3, atol=1e-3)  # same grid before timing
    if impl == "dcoco_forward":
        fn = lambda: torch.ops.dcoco.score(hidden.detach(), ids, logits.detach(), embed, *(t.detach() for t in w))
    elif impl == "dcoco_backward":
        fn = lambda: torch.ops.dcoco.score_backward(G, hidden.detach(), ids, logits.detach(), embed,
                                                    *(t.detach() for t in w))
    elif impl == "native_forward":
        fn = lambda: native_score().detach()
    else:
        score = dcoco_score if impl == "dcoco_forward_backward" else native_score
        fn = lambda: torch.autograd.grad((score() * G).sum(), (hidden, logits, *w))
    benchmark.pedantic(fn, rounds=5, warmup_rounds=1)
