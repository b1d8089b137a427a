"""`dcoco export --format gguf` (dcoco.modeling.llamacpp): the llama.cpp DFlash GGUF read back with gguf's own
reader, every tensor bit for bit against the checkpoint's, under llama.cpp's names (listed literally here), the
metadata llama.cpp's DFlash loader reads, the target's tokenizer, the corrector's dcoco.* part; and each refusal
named, with the file that was there before kept. scripts/test_llamacpp.sh also compares the export with llama.cpp's
own converter and loads it in llama-server."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from dcoco import cli
from dcoco.corrector import Corrector
from dcoco.modeling import checkpoint, llamacpp
from dcoco.modeling.dflash import DFlashConfig, DFlashDrafter
from dcoco.modeling.draft_vocab import DraftHead
from dcoco.modeling.dspark import DSparkHead

V, D = 96, 64
LAYER = {  # the names llama.cpp's converter gives a z-lab DFlash drafter's layer tensors
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight"}


def literal_name(name: str) -> str:
    top = {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
           "norm.weight": "output_norm.weight"}
    if name in top:
        return top[name]
    _, layer, rest = name.split(".", 2)
    return f"blk.{layer}.{LAYER[rest]}"


def randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return module


def make_checkpoint(path, *, corrector: bool = True, anchor: bool = False, shortlist: bool = False,
                    dtype=torch.bfloat16, seed: int = 0):
    config = DFlashConfig(hidden_size=D, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=V, mask_token_id=5, target_layer_ids=[0, 2],
                          num_target_layers=4, block_size=6, rms_norm_eps=1e-5, rope_theta=5e4,
                          max_position_embeddings=512)
    drafter = randomized(DFlashDrafter(config), seed)
    if shortlist:
        g = torch.Generator().manual_seed(seed + 1)
        drafter.draft_head = DraftHead.from_target(torch.randn(V, D, generator=g), torch.randperm(V, generator=g)[:40])
    corr = randomized(Corrector(D, 8, 32, 48, anchor), seed + 2) if corrector else None
    checkpoint.save(path, drafter, corr, "greedy", dtype=dtype)
    return checkpoint.load(path)


def tokens_gguf(path, n: int = V, *, tokenizer: bool = True):
    """A target GGUF holding only a tokenizer of n tokens (what the export copies)."""
    w = gguf.GGUFWriter(path, arch="llama")
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list([f"t{i}" for i in range(n)])
        w.add_token_types([gguf.TokenType.NORMAL] * n)
        w.add_token_merges(["t 1", "t 2"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_chat_template("{{ messages }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def fields(path) -> dict:
    return {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items() if not k.startswith("GGUF.")}


def stored(t: torch.Tensor, dtype: torch.dtype) -> bytes:
    """The bytes a tensor must have in the file: 1-D in float32, 2-D in the file's dtype."""
    t = t.detach().to(torch.float32 if t.dim() == 1 else dtype)
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()


@pytest.mark.parametrize("saved, out_dtype, anchor", [(torch.bfloat16, None, False), (torch.float32, "float32", True),
                                                      (torch.bfloat16, "float16", True)])
def test_every_tensor_reads_back_bit_for_bit(tmp_path, saved, out_dtype, anchor):
    drafter, corr = make_checkpoint(tmp_path / "ckpt", anchor=anchor, dtype=saved, seed=int(anchor))
    target = tokens_gguf(tmp_path / "target.gguf")
    out = llamacpp.export(tmp_path / "ckpt", tmp_path / "d.gguf", target, dtype=out_dtype)
    file_dtype = getattr(torch, out_dtype) if out_dtype else saved
    want = {literal_name(k): v for k, v in drafter.state_dict().items()}
    want |= {f"dcoco.{k}": v for k, v in corr.state_dict().items()}
    got = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert set(got) == set(want)
    kinds = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
    for name, t in want.items():
        dtype = torch.float32 if name.startswith("dcoco.") else file_dtype  # the corrector scores in float32
        assert got[name].tensor_type.name == ("F32" if t.dim() == 1 else kinds[dtype]), name
        assert list(got[name].shape) == list(reversed(t.shape)), name  # ggml's ne: innermost first
        assert np.asarray(got[name].data).tobytes() == stored(t, dtype), name


def test_the_metadata_is_what_llamacpps_dflash_loader_reads(tmp_path):
    drafter, corr = make_checkpoint(tmp_path / "ckpt", anchor=True)
    target = tokens_gguf(tmp_path / "target.gguf")
    meta = fields(llamacpp.export(tmp_path / "ckpt", tmp_path / "d.gguf", target))
    assert meta["general.architecture"] == "dflash" and meta["general.file_type"] == 32  # MOSTLY_BF16
    assert {k: meta[f"dflash.{k}"] for k in ("block_count", "context_length", "embedding_length",
                                              "feed_forward_length", "attention.head_count",
                                              "attention.head_count_kv", "attention.key_length",
                                              "attention.value_length", "block_size")} == {
        "block_count": 2, "context_length": 512, "embedding_length": D, "feed_forward_length": 128,
        "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 16,
        "attention.value_length": 16, "block_size": 6}
    assert meta["dflash.target_layers"] == [1, 3]  # llama.cpp counts a layer's input: ids + 1
    assert meta["dflash.rope.freq_base"] == pytest.approx(5e4)
    assert meta["dflash.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert meta["tokenizer.ggml.mask_token_id"] == 5
    assert {k: v for k, v in meta.items() if k.startswith("tokenizer.") and k != "tokenizer.ggml.mask_token_id"} == \
        {k: v for k, v in fields(target).items() if k.startswith("tokenizer.")}
    assert {k: v for k, v in meta.items() if k.startswith("dcoco.")} == pytest.approx({
        "dcoco.num_candidates": 8, "dcoco.width": 32, "dcoco.mlp_hidden": 48, "dcoco.selection": "greedy",
        "dcoco.anchor_transition": True, "dcoco.layer_norm_epsilon": 1e-5})


def test_drafter_only_has_no_dcoco_part(tmp_path):
    make_checkpoint(tmp_path / "ckpt")
    out = llamacpp.export(tmp_path / "ckpt", tmp_path / "d.gguf", tokens_gguf(tmp_path / "t.gguf"), drafter_only=True)
    assert not [k for k in fields(out) if k.startswith("dcoco.")]
    assert not [t.name for t in gguf.GGUFReader(out).tensors if t.name.startswith("dcoco.")]


def test_a_shortlisted_head_is_llamacpps_reduced_draft_vocabulary(tmp_path):
    drafter, _ = make_checkpoint(tmp_path / "ckpt", shortlist=True, dtype=torch.float32)
    out = llamacpp.export(tmp_path / "ckpt", tmp_path / "d.gguf", tokens_gguf(tmp_path / "t.gguf"))
    got = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert got["d2t"].tensor_type.name == "I64"
    assert np.asarray(got["d2t"].data).tolist() == drafter.draft_head.ids.tolist()  # absolute target ids
    assert list(got["output.weight"].shape) == [D, 40]
    assert np.asarray(got["output.weight"].data).tobytes() == stored(drafter.draft_head.weight, torch.float32)


def test_the_cli_writes_it(tmp_path, capsys):
    make_checkpoint(tmp_path / "ckpt")
    target = tokens_gguf(tmp_path / "t.gguf")
    assert cli.main(["export", str(tmp_path / "ckpt"), str(tmp_path / "d.gguf"), "--format", "gguf",
                     "--target", str(tmp_path), "--dtype", "float32"]) == 0  # a folder holding one GGUF
    assert capsys.readouterr().out.strip() == str(tmp_path / "d.gguf")
    assert fields(tmp_path / "d.gguf")["general.file_type"] == 0 and target.exists()


def dspark_checkpoint(path):
    drafter, _ = make_checkpoint(path, corrector=False)
    checkpoint.save_dspark(path, drafter, DSparkHead(D, V, 4))


@pytest.mark.parametrize("case, match", [
    ("not .gguf", "out: --format gguf writes one file"),
    ("no tokenizer", "holds no tokenizer"),
    ("vocab", "has 50 tokens, the drafter's vocab_size is 96"),
    ("no gguf", r"target: expected the target's GGUF"),
    ("dspark", "holds a DSparkHead"),
    ("dtype", "dtype: expected bfloat16, float16 or float32"),
])
def test_bad_input_is_named_and_the_old_file_stays(tmp_path, case, match):
    ckpt = tmp_path / "ckpt"
    if case == "dspark":
        dspark_checkpoint(ckpt)
    else:
        make_checkpoint(ckpt)
    (tmp_path / "empty").mkdir()
    target = {"no tokenizer": lambda: tokens_gguf(tmp_path / "t.gguf", tokenizer=False),
              "vocab": lambda: tokens_gguf(tmp_path / "t.gguf", 50),
              "no gguf": lambda: tmp_path / "empty"}.get(case, lambda: tokens_gguf(tmp_path / "t.gguf"))()
    out = tmp_path / ("d.bin" if case == "not .gguf" else "d.gguf")
    out.write_bytes(b"what was there")
    with pytest.raises(ValueError, match=match):
        llamacpp.export(ckpt, out, target, dtype="float64" if case == "dtype" else None)
    assert out.read_bytes() == b"what was there"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ckpt", "empty", out.name] +
                                                                ([] if case == "no gguf" else ["t.gguf"]))


def test_the_cli_names_draft_vocab_with_gguf(tmp_path):
    make_checkpoint(tmp_path / "ckpt")
    with pytest.raises(SystemExit, match="--draft-vocab: write the shortlisted checkpoint first"):
        cli.main(["export", str(tmp_path / "ckpt"), str(tmp_path / "d.gguf"), "--format", "gguf",
                  "--draft-vocab", "10", "--data", str(tmp_path)])
