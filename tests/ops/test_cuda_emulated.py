"""The CUDA kernels run on the CPU under tests/emulate through their real host launchers (cuda/*.cu) on fake devices:
every CUDA thread a coroutine, several blocks in flight on OS threads, real barriers, warp shuffles and inter-CTA
counters. The fused forward's schedule (split of d over CTAs, partial sums, slot groups across requests, n-tiles,
grid and walk tiles), loaders and epilogues, each tensor-core path with its instructions emulated (tensor_cores.h),
the dispatch, the table, select and the backward are checked against the reference here. Needs g++ (C++20) and the
CUDA toolkit's headers; the tensor-core paths also the nvidia-cutlass wheel's CuTe headers."""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from dcoco.ops import fused
from dcoco.ops.checks import RULES

from helpers.cases import assert_walk_matches, make_case
from helpers.emulate import build

pytestmark = pytest.mark.slow  # g++ builds the emulated runners first: minutes on 2 cores


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return build(tmp_path_factory, "run_forward")


@pytest.fixture(scope="module")
def mma_runner(tmp_path_factory):
    return build(tmp_path_factory, "run_forward", mma=True)


@pytest.fixture(scope="module")
def table_runner(tmp_path_factory):
    return build(tmp_path_factory, "run_table")


@pytest.fixture(scope="module")
def grad_runner(tmp_path_factory):
    return build(tmp_path_factory, "run_grad")


raw = lambda t: t.contiguous().view(torch.uint8).numpy().tofile


def write_inputs(folder: Path, case, ids, *meta) -> None:
    """The raw inputs and meta.txt (sizes, dtype codes, then meta) the emulated runners read."""
    h, _, lg, E = case.inputs
    m = case.corrector
    R, B, K = ids.shape
    raw(h)(folder / "hidden.bin")
    raw(ids)(folder / "ids.bin")
    raw(lg)(folder / "logits.bin")
    raw(E)(folder / "embed.bin")
    for i, w in enumerate(m.weights()):
        raw(w.detach().float())(folder / f"w{i}.bin")
    codes = fused._FLOAT_CODES
    (folder / "meta.txt").write_text(" ".join(map(str, [
        R, B, K, h.shape[2], E.shape[0], m.width, m.mlp_hidden, codes[h.dtype], fused._ID_CODES[ids.dtype],
        codes[lg.dtype], codes[E.dtype], *meta])))


# opt-in shared memory per block of sm_86/89/120 (99 KB), A100 (163 KB) and H100/H200/B200 (227 KB); the fake
# device's kernels have 1 KB of static shared memory (tests/emulate/fake_runtime.h), so plans get 1 KB less
CAPS = {"99KB": 99 * 1024, "163KB": 163 * 1024, "227KB": 227 * 1024}
STATIC_SMEM = 1024
H200 = (9, 0, 90)  # the fake device: compute capability and the loaded image's ptxVersion


def run_kernel(runner, folder: Path, case, table=None, scores=True, ids=None, sms=0, cap=CAPS["227KB"], launch=0,
               device=H200, path=None):
    """The runner on a fake device: cap its opt-in shared memory, launch > 0 the SIMT kernel launched directly with
    that many bytes (not through the launcher), path DCOCO_CUDA_PATH."""
    cand_ids = case.cand_ids if ids is None else ids
    R, B, K = cand_ids.shape
    raw(table if table is not None else torch.zeros(1))(folder / "table.bin")
    write_inputs(folder, case, cand_ids, int(table is not None), int(scores), sms, cap, launch, *device)
    env = {k: v for k, v in os.environ.items() if k != "DCOCO_CUDA_PATH"} | ({"DCOCO_CUDA_PATH": path} if path else {})
    run = subprocess.run([str(runner), str(folder)], env=env, capture_output=True, text=True)
    if run.returncode:
        print(run.stderr)
        raise subprocess.CalledProcessError(run.returncode, run.args, run.stdout, run.stderr)
    said = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    out = {"path": said["path"], "walk": said["ksplit"].split()[-1], "device": said.get("device")}
    out |= {k: torch.from_numpy(np.fromfile(folder / f"{k}.bin", dtype=np.int64)).view(R, B)
           for k in ("ranks", "tokens")}
    if scores:
        out["scores"] = torch.from_numpy(np.fromfile(folder / "scores.bin", dtype=np.float32)).view(R, B - 1, K, K)
    return out


@pytest.mark.parametrize("cap", list(CAPS))
@pytest.mark.parametrize("R,B,K,d,dtype,id_dtype,table,sms", [
    (2, 15, 4, 64, torch.float32, torch.int64, False, 0),  # no table: stage 1 also projects B K embeddings
    (2, 15, 16, 64, torch.bfloat16, torch.int32, True, 0),
    (3, 2, 4, 96, torch.float16, torch.int64, False, 0),
    (1, 16, 1, 64, torch.bfloat16, torch.int64, True, 0),
    (5, 15, 16, 256, torch.float32, torch.int32, True, 64),  # d split in 2; slot groups straddle requests
    (1, 15, 12, 400, torch.bfloat16, torch.int64, False, 64),  # d split in 3, a partial last k-block; 5-slot groups
    (5, 15, 1, 64, torch.float32, torch.int64, False, 0),  # K=1 without the table: groups shrink under 163 KB
])
def test_emulated_kernel_matches_reference(runner, tmp_path, R, B, K, d, dtype, id_dtype, table, sms, cap):
    case = make_case(R, B, K, d, V=200, dtype=dtype, id_dtype=id_dtype, seed=R + B + K + d)
    tab = case.corrector.prepare_inference(case.embed) if table else None
    s64 = case.ref_scores()
    scale = s64.abs().max().item() + 1.0
    out = run_kernel(runner, tmp_path, case, tab, scores=True, sms=sms, cap=CAPS[cap])
    torch.testing.assert_close(out["scores"].double(), s64, rtol=1e-5, atol=2e-5 * scale)
    assert_walk_matches(out["ranks"], s64, case.cand_logits[:, 0], atol=1e-4 * scale)
    assert torch.equal(out["tokens"], torch.gather(case.cand_ids.long(), 2, out["ranks"][..., None])[..., 0])
    walk_only = run_kernel(runner, tmp_path, case, tab, scores=False, sms=sms, cap=CAPS[cap])  # no grid, the walk
    assert torch.equal(walk_only["ranks"], out["ranks"]) or (walk_only["ranks"] != out["ranks"]).float().mean() < 0.05
    assert_walk_matches(walk_only["ranks"], s64, case.cand_logits[:, 0], atol=1e-4 * scale)


@pytest.mark.parametrize("cap", list(CAPS))
@pytest.mark.parametrize("R,B,K,d,dtype,table", [
    (2, 15, 16, 64, torch.bfloat16, True),
    (3, 2, 4, 96, torch.float16, False),
    (1, 4, 1, 64, torch.float32, False),
    (8, 3, 4, 64, torch.bfloat16, True),  # more than kGridWalkRequests: the walk alone is the row walk
])
def test_emulated_kernel_runs_the_anchor_transition(runner, tmp_path, R, B, K, d, dtype, table, cap):
    """The anchor transition's B+1 slots (docs/spec.md, "Anchor transition": slot 0 holds K copies of the anchor,
    logits 0, as Corrector._slots builds them) through the unchanged kernel at every cap: S_0 in every row of the
    anchor's grid, S_1.. after it, and the greedy walk from the anchor, against the float64 literal."""
    c = make_case(R, B, K, d, V=200, dtype=dtype, seed=R + B + K + d + 2, anchor=True)
    tab = c.corrector.prepare_inference(c.embed) if table else None
    _, want, _ = c.core_walk(torch.zeros(R, B, dtype=torch.int64), c.ref_first(), c.ref_scores())
    scale = want.abs().max().item() + 1.0
    for scores in (True, False):  # the whole grid, then the walk alone
        out = run_kernel(runner, tmp_path, c.slots(), tab, scores=scores, cap=CAPS[cap])
        assert_walk_matches(out["ranks"], want, torch.zeros(R, K), atol=1e-4 * scale)
        assert torch.equal(out["tokens"][:, 0], c.anchor_ids.long())
        assert torch.equal(out["tokens"][:, 1:], c.cand_ids.long().gather(2, out["ranks"][:, 1:, None])[..., 0])
        if scores:
            torch.testing.assert_close(out["scores"].double(), want, rtol=1e-5, atol=2e-5 * scale)


# fake devices whose dispatch picks each tensor-core path (DCOCO_CUDA_ARCHS_BUILT "80,90a,100a")
TENSOR_CORE_DEVICES = {"sm80": (8, 0, 80), "sm90": (9, 0, 90), "sm100": (10, 0, 100)}


@pytest.mark.parametrize("path", list(TENSOR_CORE_DEVICES))
@pytest.mark.parametrize("R,B,K,d,dtype,table,sms", [
    (2, 15, 16, 64, torch.bfloat16, True, 0),
    (3, 4, 5, 96, torch.float16, False, 0),  # stage 1 also projects the embeddings; f16 planes
    (1, 15, 12, 400, torch.bfloat16, False, 64),  # d split in 3, a partial last k-block
])
def test_tensor_core_paths_match_reference(mma_runner, tmp_path, path, R, B, K, d, dtype, table, sms):
    """The real launcher on a fake device of each arch: its tensor-core policy (sm80_mma / sm90_gmma / sm100_umma)
    runs with its instructions emulated (tests/emulate/tensor_cores.h), against the float64 reference."""
    case = make_case(R, B, K, d, V=200, dtype=dtype, seed=R + B + K + d + 1)
    tab = case.corrector.prepare_inference(case.embed) if table else None
    s64 = case.ref_scores()
    scale = s64.abs().max().item() + 1.0
    out = run_kernel(mma_runner, tmp_path, case, tab, scores=True, sms=sms, device=TENSOR_CORE_DEVICES[path])
    assert out["path"] == path
    major, minor, _ = TENSOR_CORE_DEVICES[path]
    assert out["device"].startswith(f"1 emulated (sm_{major}{minor}), CUTLASS 4.")  # cuda/device.cu's status()
    torch.testing.assert_close(out["scores"].double(), s64, rtol=1e-3, atol=1e-3 * scale)
    assert_walk_matches(out["ranks"], s64, case.cand_logits[:, 0], atol=2e-3 * scale)


@pytest.mark.parametrize("cap", list(CAPS))
@pytest.mark.parametrize("path", list(TENSOR_CORE_DEVICES))
def test_tensor_core_paths_fit_every_cap(mma_runner, tmp_path, path, cap):
    """Each tensor-core path under each device's shared memory (99 KB: sm_86/89/120, 163 KB: A100, 227 KB:
    H100/H200/B200), K=16 without the table: the plan that score, so training, launches. The plan depends on K,
    d and the cap, not on the rows, so one request of 6 slots suffices (the emulated sm_90 path is slow)."""
    case = make_case(1, 6, 16, 64, V=200, dtype=torch.bfloat16, seed=11)
    s64 = case.ref_scores()
    scale = s64.abs().max().item() + 1.0
    out = run_kernel(mma_runner, tmp_path, case, scores=True, cap=CAPS[cap], device=TENSOR_CORE_DEVICES[path])
    assert out["path"] == path
    torch.testing.assert_close(out["scores"].double(), s64, rtol=1e-3, atol=1e-3 * scale)


@pytest.mark.parametrize("R,K,walk", [
    (3, 16, "grid-smem"),  # a few requests: the grid across the GPU (a tile per predecessor), walked in shared memory
    (2, 64, "grid"),  # its grid (245 KB) does not fit shared memory: walked where stage 3 wrote it
    (8, 16, "rows"),  # more than kGridWalkRequests: the serial row walk, 1/K of the MLP terms
])
def test_the_walk_design_follows_the_batch(runner, tmp_path, R, K, walk):
    """Without a wanted grid, the walk is the hybrid of bench/models/walk_model.py: grid-then-walk for up to 6 requests,
    the row walk above; both give the reference's greedy path."""
    case = make_case(R, 15, K, 64, V=300, dtype=torch.bfloat16, seed=R + K)
    s64 = case.ref_scores()
    out = run_kernel(runner, tmp_path, case, scores=False)
    assert out["walk"] == walk
    assert_walk_matches(out["ranks"], s64, case.cand_logits[:, 0], atol=1e-4 * (s64.abs().max().item() + 1.0))
    assert torch.equal(out["tokens"], torch.gather(case.cand_ids.long(), 2, out["ranks"][..., None])[..., 0])


@pytest.fixture(scope="module")
def plan_sizes(tmp_path_factory):
    exe = build(tmp_path_factory, "plan_sizes")

    def run(rows: list[tuple]) -> list[tuple[bool, int, int]]:
        out = subprocess.run([str(exe)], input="\n".join(" ".join(map(str, r)) for r in rows), text=True,
                             capture_output=True, check=True).stdout.split("\n")
        return [(bool(int(f)), int(s), int(g)) for f, s, g in (line.split() for line in out if line)]
    return run


def test_every_k_fits_every_device(plan_sizes):
    """K = 1..64, with and without the vocabulary table, grid or walk only, at r=128 / H=256 and d up to 8192:
    the plan fits 99, 163 and 227 KB per block, and only shrinks its slot groups where it must."""
    caps = [c - STATIC_SMEM for c in CAPS.values()]
    rows = [(8, 15, K, d, 128, 256, table, scores, 1, sms, cap) for K in range(1, 65) for table in (0, 1)
            for scores in (0, 1) for d, sms in ((64, 0), (4096, 132), (8192, 148)) for cap in caps]
    plans = plan_sizes(rows)
    for row, (fits, smem, G) in zip(rows, plans):
        K, cap = row[2], row[-1]
        assert fits and smem <= cap, row
        assert G == (64 // K if K <= 64 else 1) or smem > cap - 3 * 1024 * 4, (row, G)  # shrunk only when tight
    by_cap = {cap: min(G for row, (_, _, G) in zip(rows, plans) if row[2] == 1 and row[6] == 0 and row[-1] == cap)
              for cap in caps}
    assert by_cap[caps[0]] < by_cap[caps[1]] < 64 == by_cap[caps[2]]  # K=1, no table


def test_a_cap_below_the_smallest_plan_is_an_error(runner, tmp_path):
    case = make_case(1, 4, 4, 64, V=200, seed=3)
    with pytest.raises(subprocess.CalledProcessError) as e:
        run_kernel(runner, tmp_path, case, cap=16 * 1024)
    assert e.value.returncode == 5  # the plan does not fit: refused, never launched


def test_shared_memory_past_the_launch_size_is_caught(runner, tmp_path):
    case = make_case(2, 15, 4, 64, V=200, seed=4)
    with pytest.raises(subprocess.CalledProcessError) as e:  # launched with less than the plan uses
        run_kernel(runner, tmp_path, case, launch=8 * 1024)
    assert e.value.returncode == 6


def test_emulated_kernel_never_selects_out_of_range_ids(runner, tmp_path):
    case = make_case(2, 6, 8, 64, V=200, seed=5)
    ids = case.cand_ids.clone()
    ids[0, 3, :4] = 10_000
    ids[1, 0, 0] = -4
    out = run_kernel(runner, tmp_path, case, scores=True, ids=ids)
    assert ((out["tokens"] >= 0) & (out["tokens"] < 200)).all()
    assert out["scores"][0, 2, :, :4].isnan().all()  # the invalid candidates' scores are NaN, never picked


@pytest.mark.parametrize("R,B,K,d,dtype", [(2, 15, 16, 64, torch.float32), (3, 4, 5, 96, torch.bfloat16),
                                           (1, 2, 1, 40, torch.float16), (4, 15, 16, 200, torch.bfloat16),
                                           (9, 8, 16, 136, torch.float32), (1, 3, 64, 40, torch.float16)])
def test_emulated_backward_matches_the_cpu_backward(grad_runner, tmp_path, R, B, K, d, dtype):
    """cuda/score_grad.cuh (GEMM-shaped: tiled projections, row-split weight GEMMs with ordered reductions, poisoned
    workspace and outputs) through cuda/grad.cu against cpp/cpu/grad.cpp."""
    case = make_case(R, B, K, d, V=150, dtype=dtype, seed=R + B + d, r=32, H=48)
    G = torch.randn(R, B - 1, K, K, generator=torch.Generator().manual_seed(2))
    raw(G)(tmp_path / "grad.bin")
    write_inputs(tmp_path, case, case.cand_ids)
    subprocess.run([str(grad_runner), str(tmp_path)], check=True)
    want = torch.ops.dcoco.score_backward(G, *case.inputs, *case.corrector.weights())
    names = ["d_hidden", "d_logits", *(f"d_w{i}" for i in range(10))]
    for name, ref in zip(names, want):
        got = torch.from_numpy(np.fromfile(tmp_path / f"{name}.bin", dtype=np.float32)).view(ref.shape)
        scale = ref.abs().max().item() + 1e-30
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("device,want", [
    ((10, 3, 80), "sm80"),  # a B300 with the default build loads the compute_80 PTX: never the sm100 kernel
    ((8, 6, 80), "sm80"),  # an A10: sm_80 code, 99 KB of shared memory
    ((9, 0, 80), "sm80"),  # an H200 running a build without 90a
    ((12, 0, 80), "sm80"),  # an RTX 5090
])
def test_the_launcher_dispatches_by_the_loaded_image(runner, tmp_path, device, want):
    case = make_case(2, 6, 4, 64, V=200, dtype=torch.bfloat16, seed=6)
    s64 = case.ref_scores()
    cap = CAPS["99KB"] if device[:2] in ((8, 6), (12, 0)) else CAPS["227KB"]
    out = run_kernel(runner, tmp_path, case, sms=0, cap=cap, device=device)
    assert out["path"] == want
    torch.testing.assert_close(out["scores"].double(), s64, rtol=1e-5, atol=2e-5 * (s64.abs().max().item() + 1))


def test_a_device_the_build_holds_no_code_for_is_an_error_not_a_trap(runner, tmp_path):
    case = make_case(1, 4, 4, 64, V=200, seed=7)
    with pytest.raises(subprocess.CalledProcessError) as e:  # a T4: no image of the build loads
        run_kernel(runner, tmp_path, case, device=(7, 5, -1))
    assert e.value.returncode == 8
    assert "holds no code that runs on sm_75 (built for 80,90a,100a)" in e.value.stderr


def test_a_forced_path_the_image_lacks_is_refused(runner, tmp_path):
    case = make_case(1, 4, 4, 64, V=200, seed=8)
    with pytest.raises(subprocess.CalledProcessError) as e:
        run_kernel(runner, tmp_path, case, device=H200, path="sm100")
    assert "DCOCO_CUDA_PATH=sm100: the code loaded for sm_90 has no sm100 path" in e.value.stderr
    assert run_kernel(runner, tmp_path, case, device=H200, path="simt")["path"] == "simt"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_emulated_table_and_select_match_the_cpu(table_runner, tmp_path, dtype):
    """cand_table_kernel and select_kernel through their launchers (cuda/forward.cu, cuda/select.cu)."""
    case = make_case(3, 7, 5, 96, V=150, dtype=dtype, seed=9)
    grid = case.ref_scores().float()
    raw(grid)(tmp_path / "grid.bin")
    want_table = case.corrector.prepare_inference(case.embed)
    for rule, code in RULES.items():
        write_inputs(tmp_path, case, case.cand_ids, code, 0.75)
        subprocess.run([str(table_runner), str(tmp_path)], check=True)
        got = torch.from_numpy(np.fromfile(tmp_path / f"ranks-{code}.bin", dtype=np.int64)).view(3, 7)
        assert torch.equal(got, torch.ops.dcoco.select(grid, case.cand_logits[:, 0], rule, 0.75)), rule
    table = torch.from_numpy(np.fromfile(tmp_path / "table.bin", dtype=np.float32)).view(want_table.shape)
    torch.testing.assert_close(table, want_table, rtol=1e-5, atol=1e-5 * want_table.abs().max().item())
