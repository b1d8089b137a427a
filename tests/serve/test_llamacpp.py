"""A dcoco drafter in llama.cpp (scripts/test_llamacpp.sh builds llama-server and runs this): the GGUF export equals
llama.cpp's own converter on the scale drafter, bit for bit; llama-server drafts with the exported drafter over the
embedded SmolLM2 target losslessly (greedy tokens equal to no speculation) at a mean acceptance length above 1; and
with a corrector (dcoco's scorer, integrations/llama.cpp) the lattice llama.cpp's draft graph fills equals
Corrector.score on that graph's own hidden states, candidates and logits, and drafting stays lossless.
Skipped where scripts/build_llamacpp.sh has not run."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="dcoco[demo] is not installed")
pytest.importorskip("httpx", reason="dcoco[bench] is not installed")

from dcoco import cli
from dcoco.corrector import Corrector
from dcoco.modeling import checkpoint
from dcoco.specdec.evaluate import encode
from dcoco.suites import load_suites
from dcoco.target import smollm2
from dcoco.testing.llamacpp_server import LlamaServer

ROOT = Path(__file__).parents[2]
LLAMACPP = Path(os.environ.get("DCOCO_LLAMACPP", ROOT / "build" / "llama.cpp"))
SERVER = LLAMACPP / "build" / "bin" / "llama-server"
LATTICE = LLAMACPP / "build" / "bin" / "llama-dcoco-lattice"
DRAFTER = ROOT / "checkpoints" / "smollm2-scale" / "drafter-3"
COSMETIC = {"general.name", "general.basename", "general.size_label", "general.version", "GGUF.kv_count",
            "tokenizer.ggml.add_space_prefix"}  # the converter's names from the folder; a key only the target has

pytestmark = pytest.mark.skipif(not SERVER.exists(), reason="llama-server is not built (scripts/build_llamacpp.sh)")


def quietly(*args: str) -> int:
    """`dcoco ARGS`, its output (the paths it wrote, the target's load bars) left out of the test's log."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli.main(list(args))


@pytest.fixture(scope="module")
def drafter_gguf(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "drafter.gguf"
    assert quietly("export", str(DRAFTER), str(out), "--format", "gguf", "--dtype", "float32") == 0
    return out


def convert(*args: str) -> None:
    """llama.cpp's own convert_hf_to_gguf.py (sentencepiece beside it: it reads SmolLM2's tokenizer)."""
    subprocess.run([sys.executable, str(LLAMACPP / "src" / "convert_hf_to_gguf.py"), *args], check=True,
                   env={**os.environ, "PYTHONPATH": str(LLAMACPP / "py")}, capture_output=True)


@pytest.fixture(scope="module")
def smollm2_hf(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    assert quietly("export-smollm2", str(out)) == 0
    return out


@pytest.fixture(scope="module")
def f32_target(smollm2_hf) -> Path:
    """SmolLM2 in float32 as llama.cpp converts it: greedy decoding with and without speculation can only part at
    a float32 rounding (the shipped Q4_1 file's quantized matmuls differ between batch sizes enough to flip
    near-ties)."""
    out = smollm2_hf.parent / "smollm2-f32.gguf"
    convert(str(smollm2_hf), "--outfile", str(out), "--outtype", "f32")
    return out


def test_the_export_equals_llamacpps_converter(drafter_gguf, smollm2_hf, tmp_path):
    converted = tmp_path / "converted.gguf"
    convert(str(DRAFTER), "--target-model-dir", str(smollm2_hf), "--outfile", str(converted), "--outtype", "f32")
    ours, theirs = gguf.GGUFReader(drafter_gguf), gguf.GGUFReader(converted)
    keys = {k: f.contents() for k, f in ours.fields.items() if k not in COSMETIC}
    assert keys == {k: f.contents() for k, f in theirs.fields.items() if k not in COSMETIC}
    mine = {t.name: t for t in ours.tensors}
    assert set(mine) == {t.name for t in theirs.tensors}
    for t in theirs.tensors:
        assert (mine[t.name].tensor_type, list(mine[t.name].shape)) == (t.tensor_type, list(t.shape)), t.name
        assert np.asarray(mine[t.name].data).tobytes() == np.asarray(t.data).tobytes(), t.name


def greedy(target: Path, draft: Path | None, prompts: list[list[int]], n: int) -> tuple[list, dict]:
    server = LlamaServer(SERVER, target, draft)
    try:
        return [server.complete(p, n)["tokens"] for p in prompts], server.counters()
    finally:
        server.close()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    with contextlib.redirect_stderr(io.StringIO()):  # the tokenizer's load bars
        tok = smollm2.tokenizer()
    return [p for suite in encode(tok, load_suites(rows=1)).values() for p in suite]


@pytest.fixture(scope="module")
def plain(f32_target, prompts) -> list[list[int]]:
    return greedy(f32_target, None, prompts, 32)[0]


def test_llama_server_drafts_with_it_losslessly(f32_target, drafter_gguf, prompts, plain):
    got, c = greedy(f32_target, drafter_gguf, prompts, 32)
    assert got == plain
    tau = 1 + c["spec_decode_num_accepted_tokens_total"] / c["spec_decode_num_drafts_total"]
    print(f"llama.cpp DFlash: {len(prompts)} prompts, tau {tau:.3f}")
    assert tau > 1.05


K, N_MAX = 16, 7


@pytest.fixture(scope="module", params=[False, True], ids=["paper", "anchor"])
def dcoco_gguf(request, tmp_path_factory) -> tuple[Path, Corrector]:
    """The scale drafter with a random corrector (every weight drawn, the output layer too), as a GGUF."""
    drafter, _ = checkpoint.load(DRAFTER, dtype=torch.float32)
    corrector = Corrector(drafter.config.hidden_size, K, 64, 96, anchor_transition=request.param)
    g = torch.Generator().manual_seed(int(request.param))
    with torch.no_grad():
        for p in corrector.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() == 1 else p.shape[-1] ** -0.5))
    folder = tmp_path_factory.mktemp("dcoco")
    checkpoint.save(folder / "ckpt", drafter, corrector, dtype=torch.float32)
    assert quietly("export", str(folder / "ckpt"), str(folder / "dcoco.gguf"), "--format", "gguf") == 0
    return folder / "dcoco.gguf", corrector.eval()


def target_embeddings() -> torch.Tensor:
    table = next(t for t in gguf.GGUFReader(smollm2.gguf_path()).tensors if t.name == "token_embd.weight")
    return torch.from_numpy(gguf.quants.dequantize(table.data, table.tensor_type))


def run_lattice(draft: Path, prompt: str, out: Path) -> dict[str, np.ndarray]:
    subprocess.run([str(LATTICE), "-m", str(smollm2.gguf_path()), "-md", str(draft), "--spec-type", "draft-dflash",
                    "--spec-draft-n-max", str(N_MAX), "-p", prompt, "--lattice-out", str(out), "-c", "2048"],
                   check=True, capture_output=True)
    raw = out.read_bytes()
    n_prompt, rows, d, V = np.frombuffer(raw[:16], np.int32)
    ints = np.frombuffer(raw[16:16 + 4 * (n_prompt + 1)], np.int32)
    floats = np.frombuffer(raw[16 + 4 * (n_prompt + 1):], np.float32)
    return {"anchor": int(ints[-1]), "hidden": floats[:rows * d].reshape(rows, d),
            "logits": floats[rows * d:rows * (d + V)].reshape(rows, V),
            "lattice": floats[rows * (d + V):].reshape(rows, d)}


@pytest.mark.skipif(not LATTICE.exists(), reason="llama-dcoco-lattice is not built (dcoco's patch)")
@pytest.mark.parametrize("prompt", ["The capital of France is", "def fibonacci(n):\n    "])
def test_the_lattice_equals_the_correctors_scores(dcoco_gguf, prompt, tmp_path):
    draft, corrector = dcoco_gguf
    got = run_lattice(draft, prompt, tmp_path / "lattice.bin")
    lattice, B = torch.from_numpy(got["lattice"].copy()), N_MAX
    assert lattice.shape[0] == B + 1  # the anchor's position, then the drafted slots
    ids = lattice[1:, :K].round().long()  # llama.cpp's candidates (in its own order) at positions 1..B
    logits = torch.from_numpy(got["logits"].copy())
    for p in range(1, B + 1):  # the top K of the draft's logits, ties aside
        assert set(ids[p - 1].tolist()) == set(logits[p].topk(K).indices.tolist())
    hidden = torch.from_numpy(got["hidden"].copy())
    cand_logits = logits[1:].gather(1, ids)
    grid = lattice[1:, K:K + K * K].reshape(B, K, K)  # [position, predecessor a, successor b]
    with torch.no_grad():
        if corrector.anchor_transition:
            want = corrector.score(hidden[None], ids[None], cand_logits[None], target_embeddings(),
                                   anchor_ids=torch.tensor([got["anchor"]]))[0]
        else:
            want = corrector.score(hidden[None, 1:], ids[None], cand_logits[None], target_embeddings())[0]
            want = torch.cat([cand_logits[0].expand(1, K, K), want])  # position 1 keeps the drafter's logits
    diff, moved = (grid - want).abs().max(), (want[1:] - cand_logits[1:, None, :]).abs().max()
    print(f"max |llama.cpp - dcoco| {diff:.2e}, max |Delta| {moved:.2f}")
    assert diff <= 1e-4
    assert moved > 0.1  # the corrector moved the scores


def test_llama_server_drafts_with_a_corrector_losslessly(f32_target, dcoco_gguf, prompts, plain):
    got, c = greedy(f32_target, dcoco_gguf[0], prompts, 32)
    assert got == plain
    assert c["spec_decode_num_drafts_total"] > 0
