"""The DSpark checkpoint (checkpoint.save_dspark, `dcoco export --format dspark`): a DFlash drafter and a DSparkHead
written under the names and config keys vLLM's qwen3_dspark.py loads, read back bit for bit; bad input named."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dcoco import Corrector, cli
from dcoco.modeling import checkpoint
from dcoco.modeling.dflash import DFlashConfig, DFlashDrafter
from dcoco.modeling.dspark import DSparkHead

V, D, RANK, BLOCK = 80, 32, 12, 5

# the head's tensors as vLLM's Qwen3DSparkForCausalLM names them (its markov_head / confidence_head modules)
VLLM_HEAD = {"markov_head.markov_w1.weight": (V, RANK), "markov_head.markov_w2.weight": (V, RANK),
             "confidence_head.proj.weight": (1, D + RANK), "confidence_head.proj.bias": (1,)}


def _drafter(seed: int) -> DFlashDrafter:
    torch.manual_seed(seed)
    d = DFlashDrafter(DFlashConfig(hidden_size=D, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=V, mask_token_id=V - 3,
                                   target_layer_ids=[0, 2], num_target_layers=4, block_size=BLOCK))
    with torch.no_grad():  # norms away from their all-ones start: every tensor random
        for name, p in d.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return d


def _head(seed: int, hidden: int = D, vocab: int = V, rank: int = RANK) -> DSparkHead:
    torch.manual_seed(seed)
    h = DSparkHead(hidden, vocab, rank)
    torch.nn.init.normal_(h.markov_w2.weight, std=0.5)  # a trained-looking head (a fresh one starts at zero)
    torch.nn.init.normal_(h.confidence_proj.weight)
    return h.eval()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()])


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_every_tensor_reads_back_bit_for_bit_under_vllms_names(tmp_path, dtype):
    seed = int(torch.randint(0, 2 ** 31, ()))
    drafter, head = _drafter(seed), _head(seed + 1)
    checkpoint.save_dspark(tmp_path / "ds", drafter, head, dtype)
    stored = load_file(str(tmp_path / "ds" / "model.safetensors"))
    want_dtype = dtype or torch.float32
    assert set(stored) == set(drafter.state_dict()) | set(VLLM_HEAD)
    for name, t in drafter.state_dict().items():  # the backbone: DFlash's names, as vLLM's DFlash backbone loads
        assert stored[name].dtype == want_dtype and torch.equal(_bits(stored[name]), _bits(t.to(want_dtype))), name
    source = {"markov_head.markov_w1.weight": head.markov_w1.weight, "markov_head.markov_w2.weight":
              head.markov_w2.weight, "confidence_head.proj.weight": head.confidence_proj.weight,
              "confidence_head.proj.bias": torch.zeros(1)}
    for name, shape in VLLM_HEAD.items():
        t = stored[name]
        assert tuple(t.shape) == shape and t.dtype == want_dtype, name
        assert torch.equal(_bits(t), _bits(source[name].detach().to(want_dtype))), name

    cfg = json.loads((tmp_path / "ds" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    assert cfg["markov_rank"] == RANK and cfg["markov_head_type"] == "vanilla"
    assert cfg["enable_confidence_head"] is True and cfg["confidence_head_with_markov"] is True
    assert cfg["sample_from_anchor"] is False and cfg["dspark_bonus_anchor"] is True  # DFlash's [anchor, mask x N]
    assert cfg["dflash_config"] == {"mask_token_id": V - 3, "target_layer_ids": [0, 2]}
    assert cfg["block_size"] == BLOCK and cfg["vocab_size"] == V and cfg["hidden_size"] == D
    assert cfg["dtype"] == str(want_dtype).removeprefix("torch.")

    d2, h2 = checkpoint.load_dspark(tmp_path / "ds")  # dcoco reads it back: the same drafter and head
    assert d2.config == drafter.config and h2.rank == RANK
    for a, b in ((d2, drafter), (h2, head)):
        for (k, x), (k2, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert k == k2 and torch.equal(x, y.to(want_dtype)), k


def test_cli_exports_a_dcoco_checkpoint_with_a_head_file_or_folder(tmp_path, capsys):
    drafter, head = _drafter(3), _head(4)
    checkpoint.save(tmp_path / "dcoco", drafter, Corrector(D, num_candidates=8, width=16, mlp_hidden=32))
    save_file(head.state_dict(), str(tmp_path / "head.safetensors"))
    (tmp_path / "stage").mkdir()  # what `dcoco demo`'s dspark stage leaves: model.safetensors beside done.json
    save_file(head.state_dict(), str(tmp_path / "stage" / "model.safetensors"))
    for src, out in ((tmp_path / "head.safetensors", tmp_path / "a"), (tmp_path / "stage", tmp_path / "b")):
        assert cli.main(["export", str(tmp_path / "dcoco"), str(out), "--format", "dspark", "--head", str(src),
                         "--dtype", "bfloat16"]) == 0
        assert capsys.readouterr().out.strip() == str(out)
        stored = load_file(str(out / "model.safetensors"))
        assert not any(k.startswith("corrector.") for k in stored)  # the corrector is no part of a DSpark drafter
        assert torch.equal(stored["markov_head.markov_w2.weight"], head.markov_w2.weight.detach().bfloat16())
        assert torch.equal(stored["fc.weight"], drafter.fc.weight.detach().bfloat16())
    assert (tmp_path / "a" / "config.json").read_bytes() == (tmp_path / "b" / "config.json").read_bytes()


def test_a_head_that_does_not_fit_the_drafter_is_named(tmp_path):
    drafter = _drafter(5)
    with pytest.raises(ValueError, match=rf"^head: vocab_size {V + 1} differs from the drafter's {V}$"):
        checkpoint.save_dspark(tmp_path / "x", drafter, _head(6, vocab=V + 1))
    with pytest.raises(ValueError, match=rf"^head: hidden_size {D * 2} differs from the drafter's {D}$"):
        checkpoint.save_dspark(tmp_path / "x", drafter, _head(6, hidden=D * 2))
    with pytest.raises(TypeError, match="^head: expected a dcoco.modeling.dspark.DSparkHead, got Corrector$"):
        checkpoint.save_dspark(tmp_path / "x", drafter, Corrector(D, 8, 16, 32))
    with pytest.raises(TypeError, match="^drafter: expected a DFlashDrafter, got DSparkHead$"):
        checkpoint.save_dspark(tmp_path / "x", _head(6), _head(6))
    assert not (tmp_path / "x").exists()


def test_export_errors_are_one_line_naming_the_option(tmp_path):
    checkpoint.save(tmp_path / "ck", _drafter(7))
    save_file(_head(8, vocab=V + 2).state_dict(), str(tmp_path / "wide.safetensors"))
    save_file(Corrector(D, 8, 16, 32).state_dict(), str(tmp_path / "corrector.safetensors"))
    bad = _head(8).state_dict()
    bad["markov_w2.weight"] = torch.randn(V, RANK + 1)
    save_file(bad, str(tmp_path / "bad.safetensors"))
    cases = {
        ("--format", "dspark"): "--head: --format dspark needs",
        ("--head", str(tmp_path / "wide.safetensors")): "--head: only read with --format dspark",
        ("--format", "dspark", "--head", str(tmp_path / "wide.safetensors"), "--drafter-only"): "--drafter-only: ",
        ("--format", "dspark", "--head", str(tmp_path / "nowhere")): "head: expected a DSparkHead's .safetensors",
        ("--format", "dspark", "--head", str(tmp_path / "wide.safetensors")): f"head: vocab_size {V + 2} differs",
        ("--format", "dspark", "--head", str(tmp_path / "corrector.safetensors")): "holds no DSparkHead",
        ("--format", "dspark", "--head", str(tmp_path / "bad.safetensors")): r"markov_w2.weight has shape",
    }
    for args, message in cases.items():
        with pytest.raises(SystemExit) as e:
            cli.main(["export", str(tmp_path / "ck"), str(tmp_path / "out"), *args])
        msg = str(e.value)
        assert msg.startswith("dcoco export: ") and message in msg and "\n" not in msg, (args, msg)
    assert not (tmp_path / "out").exists()


def test_load_dspark_refuses_what_dsparkhead_cannot_hold(tmp_path):
    checkpoint.save_dspark(tmp_path / "ds", _drafter(9), _head(10))

    def edit(config=None, tensors=None):
        if config:
            cfg = json.loads((tmp_path / "ds" / "config.json").read_text())
            cfg.update(config)
            (tmp_path / "ds" / "config.json").write_text(json.dumps(cfg))
        if tensors:
            t = load_file(str(tmp_path / "ds" / "model.safetensors"))
            t.update(tensors)
            save_file(t, str(tmp_path / "ds" / "model.safetensors"))

    edit(tensors={"confidence_head.proj.bias": torch.rand(1) + 0.5})
    with pytest.raises(ValueError, match=r"confidence_head.proj.bias: expected zero"):
        checkpoint.load_dspark(tmp_path / "ds")
    edit(tensors={"confidence_head.proj.bias": torch.zeros(1)}, config={"sample_from_anchor": True})
    with pytest.raises(ValueError, match=r"sample_from_anchor: expected false"):
        checkpoint.load_dspark(tmp_path / "ds")
    edit(config={"sample_from_anchor": False, "markov_rank": RANK + 4})
    with pytest.raises(ValueError, match=r"DSpark head tensors do not match the config"):
        checkpoint.load_dspark(tmp_path / "ds")
    with pytest.raises(ValueError, match=r"DSpark head tensors do not match the config"):
        checkpoint.load(tmp_path / "ds")  # load reads the DSpark layout too, with the same checks


def test_a_failed_dspark_export_leaves_the_old_folder_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "served"
    checkpoint.save_dspark(out, _drafter(12), _head(13))
    (out / "README.md").write_text("notes")  # not a checkpoint file: kept by any save
    before = {f.name: f.read_bytes() for f in out.iterdir()}

    def half_then_full(tensors, path, metadata=None):
        open(path, "wb").write(b"\1" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", half_then_full)
    with pytest.raises(OSError, match=rf"^{out}: writing the checkpoint failed .*No space left"):
        checkpoint.save_dspark(out, _drafter(14), _head(15))
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served"]  # no temporary left
    monkeypatch.undo()
    checkpoint.save_dspark(out, _drafter(14), _head(15))
    assert (out / "README.md").read_text() == "notes"
    assert torch.equal(checkpoint.load_dspark(out)[1].markov_w2.weight, _head(15).markov_w2.weight)
