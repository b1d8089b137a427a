"""Both backends on CUDA against the literal reference: runs where a GPU is visible (bench/gpu_check.sh on a
GPU); on machines without one every test here is skipped. Under each_backend's "fused" parameter the
fused kernel runs whether or not its arch is validated (that is what validates it)."""

import pytest
import torch

import dcoco

from helpers.cases import backend_score, check_against_literal, make_case

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none on this machine"),
              pytest.mark.usefixtures("each_backend")]


def to_cuda(case):
    case.corrector.cuda()
    case.hidden, case.cand_ids, case.cand_logits, case.embed = (t.cuda() for t in case.inputs)
    if case.anchor_ids is not None:
        case.anchor_ids = case.anchor_ids.cuda()
    return case


def paths():
    """The fused kernel paths the code loaded for this GPU holds (DCOCO_CUDA_PATH); "" is the automatic choice."""
    if not dcoco.cuda_available():
        return [""]
    best = dcoco._C.cuda_path()  # dcoco/dispatch.h, from the image the runtime loaded
    return ["", "simt"] + (["sm80"] if best != "simt" else []) + ([best] if best in ("sm90", "sm100") else [])


# float32 inputs run exact fp32 FMAs; 16-bit inputs run tensor cores on float32 weights split in two
# 16-bit planes (relative residue ~2^-16), hence a slightly looser bound there
def tolerance(dtype, path):
    return 1e-5 if dtype == torch.float32 or path == "simt" else 1e-4


def check_forward(R, d, dtype, table, path="", anchor=False):
    """score, walk_inputs and the walk on B = 15 slots (with the anchor transition B+1 = 16, as the plugin runs
    it at N = 15) against the float64 literal."""
    case = to_cuda(make_case(R, 15, 16, d, V=1000, dtype=dtype, seed=R * (11 if anchor else 7) + d, anchor=anchor))
    if table:
        case.corrector.prepare_inference(case.embed)
    check_against_literal(case, tolerance(dtype, path), same_walk=False)


def check_anchor(R, d, dtype, table, path=""):
    check_forward(R, d, dtype, table, path, anchor=True)


# (check, R, d): the paper's corrector over every width and batch, the anchor transition on three of them
CASES = [(check_forward, R, d) for d in (64, 2048, 2560, 4096) for R in (1, 3, 32)] + \
    [(check_anchor, R, d) for R, d in ((1, 4096), (3, 2560), (32, 64))]


@pytest.mark.parametrize("check,R,d", CASES, ids=[f"{c.__name__[6:]}-R{R}-d{d}" for c, R, d in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("table", [False, True])
def test_cuda_matches_reference(check, R, d, dtype, table):
    check(R, d, dtype, table)


@pytest.mark.fused_only
@pytest.mark.parametrize("check", [check_forward, check_anchor], ids=["forward", "anchor"])
@pytest.mark.parametrize("path", paths())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("table", [False, True])
def test_cuda_every_path_matches_reference(monkeypatch, check, path, dtype, table):
    monkeypatch.setenv("DCOCO_CUDA_PATH", path)
    check(5, 2560, dtype, table, path)


@pytest.mark.fused_only
def test_cuda_path_override_is_checked(monkeypatch):
    monkeypatch.setenv("DCOCO_CUDA_PATH", "tpu")
    case = to_cuda(make_case(1, 15, 16, 64, V=100, seed=5))
    with pytest.raises(ValueError, match="DCOCO_CUDA_PATH=tpu"):
        case.corrector(*case.inputs)


def test_cuda_matches_cpu_walk_and_is_deterministic():
    case = make_case(64, 15, 16, 4096, V=5000, dtype=torch.bfloat16, seed=1)
    cpu_ranks = case.corrector(*case.inputs)[0]
    to_cuda(case)
    first = case.corrector(*case.inputs)[0]
    again = case.corrector(*case.inputs)[0]
    assert torch.equal(first, again)
    assert (first.cpu() == cpu_ranks).float().mean() > 0.99


@pytest.mark.parametrize("table", [False, True])
def test_cuda_graph_capture_replays_the_same(table):
    """The walk (with and without the table), the score grid and a path rule, captured once, replayed."""
    case = to_cuda(make_case(8, 15, 16, 4096, V=5000, dtype=torch.bfloat16, seed=2))
    m = case.corrector
    if table:
        m.prepare_inference(case.embed)

    def step():
        scores = m.score(*case.inputs)
        return (*m(*case.inputs), scores, dcoco.select(scores, case.cand_logits[:, 0], "geometric", 0.75))

    with torch.no_grad():
        want = step()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):  # warm up on a side stream, as capture requires
            step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for _ in range(3):
            graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(out, want))


def test_cuda_table_matches_cpu():
    case = make_case(1, 2, 4, 2560, V=3000, dtype=torch.bfloat16, seed=3)
    cpu = case.corrector.prepare_inference(case.embed)
    to_cuda(case)
    gpu = case.corrector.prepare_inference(case.embed)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5)


def test_cuda_out_of_range_ids_are_never_selected():
    case = to_cuda(make_case(2, 15, 16, 64, V=100, seed=4))
    ids = case.cand_ids.clone()
    ids[0, 3, 0] = 10_000  # rank 0 of slot 4: would be the argmax at a fresh corrector
    ranks, tokens = case.corrector(case.hidden, ids, case.cand_logits, case.embed)
    torch.cuda.synchronize()
    assert ((tokens >= 0) & (tokens < 100)).all()


def score_grads(case, G):
    """Gradients of sum(score * G) in hidden, cand_logits and every weight, on the current backend."""
    h = case.hidden.clone().float().requires_grad_()
    lg = case.cand_logits.clone().float().requires_grad_()
    ws = [w.detach().clone().requires_grad_() for w in case.corrector.weights()]
    (backend_score(h, case.cand_ids, lg, case.embed, ws) * G).sum().backward()
    return [h.grad, lg.grad, *(w.grad for w in ws)]


@pytest.mark.parametrize("R,d,dtype", [(1, 2048, torch.bfloat16), (4, 4096, torch.bfloat16), (3, 576, torch.float32)])
def test_cuda_backward_matches_the_cpu_core(R, d, dtype):
    case = make_case(R, 15, 16, d, V=1000, dtype=dtype, seed=R + d)
    G = torch.randn(R, 14, 16, 16)
    with dcoco.use_backend("fused"):
        want = score_grads(case, G)  # the CPU core's compiled backward, tested against the reference
    to_cuda(case)
    got = score_grads(case, G.cuda())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5 * (b.abs().max().item() + 1e-30))
    if dcoco.get_backend() == "fused":
        assert all(torch.equal(a, b) for a, b in zip(got, score_grads(case, G.cuda())))  # deterministic
