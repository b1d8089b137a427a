"""The fused CUDA forward (cuda/fused_correct.cuh with its SIMT MMA policy) run on the CPU under tests/emulate:
every CUDA thread a coroutine, several blocks in flight on OS threads, real barriers, warp shuffles and
inter-CTA counters. Its schedule (split of d over CTAs, partial sums, slot groups across requests, n-tiles,
grid and walk tiles), loaders and epilogues are checked against the reference here; the tensor-core
policies share all of it but their MMAs, and run only on a GPU (bench/gpu_check.sh). Needs g++ (C++20)."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from dcoco import _ops

from conftest import assert_walk_matches, make_case

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("needs g++ to build the emulated kernel")
    exe = tmp_path_factory.mktemp("emu") / "run_correct"
    subprocess.run([cxx, "-std=c++20", "-O2", "-pthread", f"-I{ROOT / 'tests/emulate'}", f"-I{ROOT / 'cuda'}",
                    f"-I{ROOT / 'cpp/include'}", str(ROOT / "tests/emulate/run_correct.cpp"), "-o", str(exe)],
                   check=True)
    return exe


def run_kernel(runner, folder: Path, case, table=None, scores=True, ids=None, sms=0):
    h, cand_ids, lg, E = case.inputs
    cand_ids = cand_ids if ids is None else ids
    m = case.corrector
    R, B, K = cand_ids.shape
    raw = lambda t: t.contiguous().view(torch.uint8).numpy().tofile  # noqa: E731
    raw(h)(folder / "hidden.bin")
    raw(cand_ids)(folder / "ids.bin")
    raw(lg)(folder / "logits.bin")
    raw(E)(folder / "embed.bin")
    raw(table if table is not None else torch.zeros(1))(folder / "table.bin")
    for i, w in enumerate(m.weights()):
        raw(w.detach().float())(folder / f"w{i}.bin")
    codes = _ops._FLOAT_CODES
    (folder / "meta.txt").write_text(" ".join(map(str, [
        R, B, K, h.shape[2], E.shape[0], m.width, m.mlp_hidden, codes[h.dtype], _ops._ID_CODES[cand_ids.dtype],
        codes[lg.dtype], codes[E.dtype], int(table is not None), int(scores), sms])))
    subprocess.run([str(runner), str(folder)], check=True)
    out = {k: torch.from_numpy(np.fromfile(folder / f"{k}.bin", dtype=np.int64)).view(R, B) for k in ("ranks", "tokens")}
    if scores:
        out["scores"] = torch.from_numpy(np.fromfile(folder / "scores.bin", dtype=np.float32)).view(R, B - 1, K, K)
    return out


@pytest.mark.parametrize("R,B,K,d,dtype,id_dtype,table,sms", [
    (2, 15, 4, 64, torch.float32, torch.int64, False, 0),  # no table: stage 1 also projects B K embeddings
    (2, 15, 16, 64, torch.bfloat16, torch.int32, True, 0),
    (3, 2, 4, 96, torch.float16, torch.int64, False, 0),
    (1, 16, 1, 64, torch.bfloat16, torch.int64, True, 0),
    (5, 15, 16, 256, torch.float32, torch.int32, True, 64),  # d split in 2; slot groups straddle requests
    (1, 15, 12, 400, torch.bfloat16, torch.int64, False, 64),  # d split in 3, a partial last k-block; 5-slot groups
])
def test_emulated_kernel_matches_reference(runner, tmp_path, R, B, K, d, dtype, id_dtype, table, sms):
    case = make_case(R, B, K, d, V=200, dtype=dtype, id_dtype=id_dtype, seed=R + B + K + d)
    tab = case.corrector.prepare_inference(case.embed) if table else None
    s64 = case.ref_scores()
    scale = s64.abs().max().item() + 1.0
    out = run_kernel(runner, tmp_path, case, tab, scores=True, sms=sms)
    torch.testing.assert_close(out["scores"].double(), s64, rtol=1e-5, atol=2e-5 * scale)
    assert_walk_matches(out["ranks"], s64, case.cand_logits[:, 0], atol=1e-4 * scale)
    assert torch.equal(out["tokens"], torch.gather(case.cand_ids.long(), 2, out["ranks"][..., None])[..., 0])
    walk_only = run_kernel(runner, tmp_path, case, tab, scores=False, sms=sms)  # the walk without the grid
    assert torch.equal(walk_only["ranks"], out["ranks"]) or (walk_only["ranks"] != out["ranks"]).float().mean() < 0.05
    assert_walk_matches(walk_only["ranks"], s64, case.cand_logits[:, 0], atol=1e-4 * scale)


def test_emulated_kernel_never_selects_out_of_range_ids(runner, tmp_path):
    case = make_case(2, 6, 8, 64, V=200, seed=5)
    ids = case.cand_ids.clone()
    ids[0, 3, :4] = 10_000
    ids[1, 0, 0] = -4
    out = run_kernel(runner, tmp_path, case, scores=True, ids=ids)
    assert ((out["tokens"] >= 0) & (out["tokens"] < 200)).all()
    assert out["scores"][0, 2, :, :4].isnan().all()  # the invalid candidates' scores are NaN, never picked
