"""The native backend's own contract (native.py): chunked = whole, no graph break under torch.compile, bf16
autocast, any device (meta: shapes only, so no host sync can hide), ids off the CPU, bounded memory.
Its agreement with the literal reference runs in the API tests (test_ops, test_grad, test_select, ...), which
take both backends."""

import json
import os
import subprocess
import sys

import pytest
import torch

import dcoco
from dcoco.ops import native

from helpers import ROOT
from helpers.cases import assert_walk_matches, make_case


@pytest.fixture(autouse=True)
def native_backend():
    with dcoco.use_backend("native"):
        yield


def grads(case, fn):
    h = case.hidden.clone().requires_grad_()
    lg = case.cand_logits.clone().requires_grad_()
    G = torch.randn(case.hidden.shape[0], case.hidden.shape[1] - 1, *case.cand_ids.shape[2:] * 2,
                    generator=torch.Generator().manual_seed(5))
    case.corrector.zero_grad()
    s = fn(h, case.cand_ids, lg, case.embed)
    (s * G).sum().backward()
    return [s.detach(), h.grad, lg.grad, *(w.grad.clone() for w in case.corrector.weights())]


def test_chunks_give_the_unchunked_results(monkeypatch):
    case = make_case(5, 15, 16, 64, seed=1)
    m = case.corrector
    whole = grads(case, m.score)
    plain = m(*case.inputs)
    monkeypatch.setattr(native, "CHUNK_BYTES", 1)  # one request per chunk, each recomputed in the backward
    monkeypatch.setattr(native, "GRID_BYTES", 1)   # and one per chunk without autograd (the walk)
    for got, want in zip(grads(case, m.score), whole):  # weight gradients summed per chunk: fp32 rounding
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert torch.equal(m(*case.inputs)[0], plain[0])
    monkeypatch.setattr(native, "TABLE_ROWS", 7)
    table = m.prepare_inference(case.embed)
    torch.testing.assert_close(table, torch.ops.dcoco.cand_table(case.embed, m.cand_proj.weight, m.fuse_proj.weight),
                               rtol=1e-5, atol=1e-5)
    assert torch.equal(m(*case.inputs)[0], plain[0])


def test_compiles_fullgraph_forward_backward_table_and_rules():
    """fullgraph=True fails on any graph break: score with its backward (through the recomputed chunks), the
    table, the walk with and without it, and the three rules, all in one graph. Dynamo + AOT autograd
    (aot_eager): what finds graph breaks, without inductor's C++ builds (test_ops compiles with inductor)."""
    case = make_case(3, 6, 16, 64, seed=2)  # B=6: every loop unrolls, in a graph that compiles in seconds
    m = case.corrector
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss_fn(hidden, ids, logits, embed):
        return (m.score(hidden, ids, logits, embed) ** 2).mean()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def infer(hidden, ids, logits, embed):
        table = native.cand_table(embed, m.cand_proj.weight, m.fuse_proj.weight)
        walked = native.correct(hidden, ids, logits, embed, m.weights(), table)[0]
        plain = m(hidden, ids, logits, embed)[0]
        scores = m.score(hidden, ids, logits, embed)
        rules = [dcoco.select(scores, logits[:, 0], rule, 0.75) for rule in ("greedy", "global", "geometric")]
        return walked, plain, scores, rules

    eager = grads(case, lambda *a: m.score(*a))
    h = case.hidden.clone().requires_grad_()
    loss_fn(h, case.cand_ids, case.cand_logits, case.embed).backward()
    want_h = torch.autograd.grad((m.score(h, *case.inputs[1:]) ** 2).mean(), h)[0]
    torch.testing.assert_close(h.grad, want_h, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        walked, plain, scores, rules = infer(*case.inputs)
    torch.testing.assert_close(scores, eager[0], rtol=1e-5, atol=1e-5)
    s64 = case.ref_scores()
    assert_walk_matches(walked, s64, case.cand_logits[:, 0], atol=1e-4)
    assert torch.equal(plain, walked)
    for rule, got in zip(("greedy", "global", "geometric"), rules):
        assert torch.equal(got, dcoco.select(scores, case.cand_logits[:, 0], rule, 0.75)), rule


def test_bf16_autocast_computes_in_float32_and_trains_a_bf16_module():
    case = make_case(3, 15, 16, 64, seed=3)
    want = case.corrector.score(*case.inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = case.corrector.score(*case.inputs)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    m = case.corrector.bfloat16()
    h = case.hidden.bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s = m.score(h, case.cand_ids, case.cand_logits, case.embed)
    s.square().mean().backward()
    assert h.grad.dtype == torch.bfloat16 and all(p.grad.dtype == torch.bfloat16 for p in m.parameters())
    assert all(p.grad.abs().sum() > 0 for p in m.parameters())


def test_any_device_without_host_sync():
    """On the meta device any host sync or value-dependent branch would raise: every entry point runs."""
    case = make_case(2, 15, 16, 64, seed=4)
    m = case.corrector.to("meta")
    inputs = [t.to("meta") for t in case.inputs]
    hidden = inputs[0].requires_grad_()
    scores = m.score(hidden, *inputs[1:])
    assert scores.shape == (2, 14, 16, 16) and scores.device.type == "meta"
    scores.sum().backward()
    assert hidden.grad.shape == hidden.shape
    ranks, tokens = m(*inputs)
    assert ranks.shape == tokens.shape == (2, 15)
    table = native.cand_table(inputs[3], m.cand_proj.weight, m.fuse_proj.weight)
    assert table.shape == (case.embed.shape[0], 128)
    for rule in ("greedy", "global", "geometric"):
        assert dcoco.select(scores.detach(), inputs[2][:, 0], rule).shape == (2, 15)


def test_an_out_of_range_id_off_the_cpu_is_never_selected(monkeypatch):
    """Where a check would sync (CUDA, or any compiled graph), a bad id reads row 0 with a NaN logit, as the
    CUDA kernel does: its scores are NaN and the walk never picks it."""
    monkeypatch.setattr(native, "is_compiling", lambda: True)
    case = make_case(2, 5, 4, 64, V=50, seed=5)
    ids = case.cand_ids.clone()
    ids[0, 0, 0], ids[1, 2, 1] = 50, -3
    logits = case.cand_logits.clone()
    logits[0, 0, 0] = 100.0  # would be the argmax of slot 1
    scores = case.corrector.score(case.hidden, ids, logits, case.embed)
    assert scores[1, 1, :, 1].isnan().all() and scores[1, 2, 1].isnan().all()
    ranks, tokens = case.corrector(case.hidden, ids, logits, case.embed)
    assert ranks[0, 0] != 0 and ranks[1, 2] != 1


def test_memory_stays_bounded():
    """score + backward at R=64, d=1024 (a whole pre-activation tensor of 0.22 GiB, plus as much again for
    GELU's output, its gradient, ...): the native path's extra peak stays within a few chunks' worth."""
    script = ROOT / "bench" / "native_memory.py"
    # glibc's mmap threshold fixed at 1 MB: freed chunk buffers leave the resident set at once, instead of
    # staying in the heap by chance (which made this peak vary by 100 MB from run to run)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    out = subprocess.run([sys.executable, str(script), "--R", "64", "--d", "1024", "--V", "4096", "--backends",
                          "native", "--out", "/dev/stdout"], capture_output=True, text=True, check=True, env=env).stdout
    row = json.loads(out[out.index("{"):])["results"][0]
    assert row["extra_peak_bytes"] < 2 * row["preactivation_bytes"], row
    assert row["extra_peak_bytes"] < 10 * native.CHUNK_BYTES, row


@pytest.mark.parametrize("T", [0, 1, 2, 3, 4, 7, 8, 9, 14, 16, 31, 33])
def test_pointer_doubling_is_the_serial_walk(T):
    """_compose's log-depth prefix composition against the plain left-to-right loop, any number of maps."""
    g = torch.Generator().manual_seed(T)
    f = torch.randint(0, 5, (7, T, 5), generator=g)
    k = torch.randint(0, 5, (7,), generator=g)
    want = [k]
    for p in range(T):
        want.append(f[torch.arange(7), p, want[-1]])
    assert torch.equal(native._compose(f, k), torch.stack(want, 1))


def serial_viterbi(scores, first, lam):
    """The core's rule, literally: right to left, each node keeps its lowest-rank best successor; NaN loses."""
    R, T, K, _ = scores.shape
    out = torch.empty(R, T + 1, dtype=torch.int64)
    for q in range(R):
        after, nxt = [0.0] * K, [[0] * K for _ in range(T)]
        for p in range(T - 1, -1, -1):
            vals = []
            for a in range(K):
                row = [lam ** p * float(scores[q, p, a, b]) + after[b] for b in range(K)]
                row = [float("-inf") if v != v else v for v in row]
                nxt[p][a] = max(range(K), key=lambda b: (row[b], -b))
                vals.append(row[nxt[p][a]])
            after = vals
        start = [float(first[q, a]) + after[a] for a in range(K)]
        start = [float("-inf") if v != v else v for v in start]
        k = max(range(K), key=lambda a: (start[a], -a))
        out[q, 0] = k
        for p in range(T):
            k = nxt[p][k]
            out[q, p + 1] = k
    return out


@pytest.mark.parametrize("B", [2, 3, 9, 15, 17, 33])
@pytest.mark.parametrize("rule,lam", [("global", 1.0), ("geometric", 0.5)])
def test_max_plus_scan_is_the_serial_viterbi(B, rule, lam):
    """Small integers with ties everywhere and a NaN or an infinity here and there: every partial sum is exact
    (lam = 0.5 keeps them dyadic), so the tree-ordered scan must pick the very path of the serial rule."""
    g = torch.Generator().manual_seed(B)
    scores = torch.randint(-2, 3, (4, B - 1, 4, 4), generator=g).float()
    first = torch.randint(-1, 2, (4, 4), generator=g).float()
    scores[0, 0, 1, 2], scores[1, -1, 0, 0], scores[2, B // 2 - 1, 3, 1] = float("nan"), float("inf"), float("-inf")
    first[3, 0] = float("nan")
    assert torch.equal(native.select(scores, first, rule, lam), serial_viterbi(scores, first, lam))
