"""DFlash drafter: block mask semantics, checkpoint layout and IO errors, dflash_loss by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from dcoco.modeling.dflash import DFlashConfig, DFlashDrafter, block_mask, build_target_layer_ids, dflash_loss

V, D, BS = 100, 64, 4


def tiny_config(**kw) -> DFlashConfig:
    args = dict(hidden_size=D, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=V, mask_token_id=99, target_layer_ids=[0, 2],
                num_target_layers=4, block_size=BS, rope_theta=10000.0)
    return DFlashConfig(**{**args, **kw})


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = DFlashDrafter(tiny_config()).double().eval()
    embed = torch.randn(V, D, dtype=torch.float64)
    N, S = 2, 11
    ids = torch.randint(0, 99, (N, S))
    feats = torch.randn(N, S, 2 * D, dtype=torch.float64)
    anchors = torch.tensor([[0, 4, 10], [7, 3, 3]])   # first slot, last slot, a repeated anchor
    return model, embed, ids, feats, anchors


def test_parameter_names_are_the_checkpoint_names():
    m = DFlashDrafter(tiny_config())
    names = set(m.state_dict())
    per_layer = {f"self_attn.{p}_proj.weight" for p in "qkvo"} | {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}
    per_layer |= {f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    per_layer |= {"input_layernorm.weight", "post_attention_layernorm.weight"}
    expected = {f"layers.{i}.{n}" for i in range(2) for n in per_layer} | {"fc.weight", "hidden_norm.weight",
                                                                          "norm.weight"}
    assert names == expected
    assert m.fc.weight.shape == (D, 2 * D)
    assert m.layers[0].self_attn.k_proj.weight.shape == (2 * 16, D)


def test_multi_block_forward_equals_each_block_alone(setup):
    model, embed, ids, feats, anchors = setup
    with torch.no_grad():
        h = model(ids, feats, anchors, embed)
        assert h.shape == (2, 3, BS, D)
        for n in range(2):
            for a in range(3):
                p = int(anchors[n, a])
                alone = model.draft(ids[n, p:p + 1], feats[n:n + 1, :p], embed)
                torch.testing.assert_close(h[n, a], alone[0], rtol=0, atol=1e-12)


def test_padded_draft_batch_equals_rows_alone(setup):
    model, embed, ids, feats, _ = setup
    lens = torch.tensor([5, 9])
    with torch.no_grad():
        batch = model.draft(ids[:, 9], feats[:, :9], embed, context_len=lens)
        for n in range(2):
            alone = model.draft(ids[n, 9:10], feats[n:n + 1, :int(lens[n])], embed)
            torch.testing.assert_close(batch[n], alone[0], rtol=0, atol=1e-12)


def test_context_at_or_after_the_anchor_is_invisible(setup):
    model, embed, ids, feats, anchors = setup
    with torch.no_grad():
        h = model(ids, feats, anchors, embed)
        p = 4   # block (0, 1)
        after = feats.clone()
        after[0, p:] += torch.randn_like(after[0, p:]) * 10
        torch.testing.assert_close(model(ids, after, anchors, embed)[0, 1], h[0, 1], rtol=0, atol=0)
        before = feats.clone()
        before[0, p - 1] += 1.0   # the last visible context position does matter
        assert (model(ids, before, anchors, embed)[0, 1] - h[0, 1]).abs().max() > 1e-6
        # and other sequences' context never leaks in
        torch.testing.assert_close(model(ids, before, anchors, embed)[1], h[1], rtol=0, atol=0)


def test_block_mask_layout():
    m = block_mask(torch.tensor([[2, 0]]), 3, 2)[0, 0].int()
    assert m.tolist() == [[1, 1, 0, 1, 1, 0, 0],
                          [1, 1, 0, 1, 1, 0, 0],
                          [0, 0, 0, 0, 0, 1, 1],
                          [0, 0, 0, 0, 0, 1, 1]]


def test_gradients_reach_the_drafter_not_the_target(setup):
    _, embed, ids, feats, anchors = setup
    model = DFlashDrafter(tiny_config()).double()
    emb = torch.nn.Embedding.from_pretrained(embed)   # frozen target module
    h = model(ids, feats, anchors, emb)
    DFlashDrafter.compute_logits(h, embed).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert emb.weight.grad is None and "embed" not in "".join(model.state_dict())


def test_logits_through_module_or_weight(setup):
    model, embed, ids, feats, anchors = setup
    head = torch.nn.Linear(D, V, bias=False).double()
    h = model(ids, feats, anchors, embed)
    torch.testing.assert_close(DFlashDrafter.compute_logits(h, head), DFlashDrafter.compute_logits(h, head.weight))
    with pytest.raises(TypeError, match="lm_head"):
        DFlashDrafter.compute_logits(h, "head")


def test_target_features():
    model = DFlashDrafter(tiny_config())
    hs = [torch.full((1, 2, D), float(i)) for i in range(5)]
    f = model.target_features(hs)
    assert f.shape == (1, 2, 2 * D) and f[0, 0, 0] == 1.0 and f[0, 0, D] == 3.0   # outputs of layers 0 and 2


def test_save_load_round_trip(setup, tmp_path):
    model, embed, ids, feats, anchors = setup
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": 99, "target_layer_ids": [0, 2]}
    assert (cfg["block_size"], cfg["num_target_layers"], cfg["head_dim"], cfg["dtype"]) == (BS, 4, 16, "float64")
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(model.state_dict())
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert loaded.config == model.config and loaded.fc.weight.dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, feats, anchors, embed), model(ids, feats, anchors, embed),
                                   rtol=0, atol=0)
    assert DFlashDrafter.from_pretrained(tmp_path, dtype=torch.bfloat16).norm.weight.dtype == torch.bfloat16


def test_config_reads_like_transformers_qwen3(tmp_path):
    transformers = pytest.importorskip("transformers",
                                       reason="reading config.json back needs transformers (the demo or train extra)")
    DFlashDrafter(tiny_config()).save_pretrained(tmp_path)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)   # what vLLM parses the draft config with
    assert hf.model_type == "qwen3" and hf.head_dim == 16 and hf.num_key_value_heads == 2
    assert hf.rope_parameters["rope_theta"] == 10000.0 and hf.dflash_config["target_layer_ids"] == [0, 2]


def test_sharded_checkpoint(setup, tmp_path):
    model = setup[0]
    model.save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    names = sorted(sd)
    shards = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for f, keys in shards.items():
        save_file({k: sd[k] for k in keys}, str(tmp_path / f))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in sd.items())


def rewrite(path, config=None, tensors=None):
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize("edit, match", [
    (lambda c, t: c.update(architectures=["Qwen3ForCausalLM"]), "architectures"),
    (lambda c, t: c.update(model_type="llama"), "model_type"),
    (lambda c, t: c.pop("hidden_size"), "missing hidden_size"),
    (lambda c, t: c.update(dflash_config={}), "missing mask_token_id"),
    (lambda c, t: c.update(layer_types=["sliding_attention"] * 2), "layer_types"),
    (lambda c, t: c.update(attention_bias=True), "attention_bias"),
    (lambda c, t: c.update(draft_vocab_size=32), "draft_vocab_size 32 but the checkpoint has no lm_head.weight or d2t"),
    (lambda c, t: c.update(num_key_value_heads=3), "num_key_value_heads"),
    (lambda c, t: t.pop("layers.1.mlp.up_proj.weight"), r"missing \['layers.1.mlp.up_proj.weight'\]"),
    (lambda c, t: t.update({"embed_tokens.weight": torch.zeros(V, D)}), r"unexpected \['embed_tokens.weight'\]"),
    (lambda c, t: t.update({"fc.weight": torch.zeros(D, 3 * D)}), "fc.weight has shape"),
    (lambda c, t: c["dflash_config"].update(target_layer_ids=[0, 1, 2]), "fc.weight has shape"),
])
def test_wrong_checkpoints(tmp_path, edit, match):
    DFlashDrafter(tiny_config()).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    edit(config, tensors)
    rewrite(tmp_path, config, tensors)
    with pytest.raises(ValueError, match=match):
        DFlashDrafter.from_pretrained(tmp_path)


def test_missing_files(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        DFlashDrafter.from_pretrained(tmp_path)
    DFlashDrafter(tiny_config()).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="model.safetensors"):
        DFlashDrafter.from_pretrained(tmp_path)


def test_inv_freq_buffers_are_ignored(tmp_path):
    DFlashDrafter(tiny_config()).save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    rewrite(tmp_path, tensors={**tensors, "rotary_emb.inv_freq": torch.ones(8)})
    DFlashDrafter.from_pretrained(tmp_path)


def test_real_config_variants():
    # the z-lab / SpecForge Qwen3-8B drafter config, without dflash_config: default taps
    real = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": False, "block_size": 16,
            "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
            "layer_types": ["full_attention"] * 5, "max_position_embeddings": 40960, "num_attention_heads": 32,
            "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 36, "rms_norm_eps": 1e-06,
            "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "use_sliding_window": False,
            "vocab_size": 151936, "mask_token_id": 151669}
    c = DFlashConfig.from_dict(real)
    assert c.target_layer_ids == [1, 9, 17, 25, 33] and c.mask_token_id == 151669 and c.rope_theta == 1e6
    c = DFlashConfig.from_dict({**real, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [3]}})
    assert (c.mask_token_id, c.target_layer_ids) == (5, [3])
    assert build_target_layer_ids(30, 5) == [1, 8, 14, 20, 27] and build_target_layer_ids(36, 1) == [18]
    assert DFlashConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("call, exc, name", [
    (lambda m, e, i, f, a: m(i.float(), f, a, e), TypeError, "input_ids"),
    (lambda m, e, i, f, a: m(i, f[:, :5], a, e), ValueError, "target_hidden"),
    (lambda m, e, i, f, a: m(i, f[..., :D], a, e), ValueError, "target_hidden"),
    (lambda m, e, i, f, a: m(i, f.long(), a, e), TypeError, "target_hidden"),
    (lambda m, e, i, f, a: m(i, f, a + 1, e), ValueError, "anchors"),
    (lambda m, e, i, f, a: m(i, f, a[0], e), ValueError, "anchors"),
    (lambda m, e, i, f, a: m(i, f, a, e[:, :8]), ValueError, "embed"),
    (lambda m, e, i, f, a: m(i, f, a, None), TypeError, "embed"),
    (lambda m, e, i, f, a: m.draft(i[:, 0], f, e, context_len=torch.tensor([1, 99])), ValueError, "context_len"),
    (lambda m, e, i, f, a: m.draft(i, f, e), ValueError, "anchor_ids"),
])
def test_input_errors(setup, call, exc, name):
    model, embed, ids, feats, anchors = setup
    with pytest.raises(exc, match=name):
        call(model, embed, ids, feats, anchors)


def test_config_errors():
    with pytest.raises(ValueError, match="mask_token_id"):
        tiny_config(mask_token_id=100)
    with pytest.raises(ValueError, match="target_layer_ids"):
        tiny_config(target_layer_ids=[4])
    with pytest.raises(ValueError, match="block_size"):
        tiny_config(block_size=1)
    with pytest.raises(TypeError, match="config"):
        DFlashDrafter({"hidden_size": 64})


def test_dflash_loss_by_hand():
    # R=1, B=3 drafted slots, V=2; slot 3 invalid
    logits = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [5.0, -5.0]]], requires_grad=True)
    labels = torch.tensor([[0, 0, 1]])
    valid = torch.tensor([[True, True, False]])
    g = 2.0
    ce1, ce2 = math.log(1 + math.exp(-2.0)), math.log(1 + math.exp(1.0))
    w1, w2 = 1.0, math.exp(-1 / g)
    loss = dflash_loss(logits, labels, valid, gamma=g)
    assert loss.item() == pytest.approx((w1 * ce1 + w2 * ce2) / (w1 + w2), rel=1e-6)
    loss.backward()
    assert logits.grad[0, 2].abs().sum() == 0


def test_dflash_loss_nothing_valid():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    loss = dflash_loss(logits, torch.full((2, 3), -100), torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(logits=torch.zeros(1, 3)), ValueError, "logits"),
    (dict(labels=torch.zeros(1, 3)), TypeError, "labels"),
    (dict(labels=torch.full((1, 3), 7)), ValueError, "labels"),
    (dict(valid=torch.ones(1, 3)), TypeError, "valid"),
    (dict(valid=torch.ones(1, 2, dtype=torch.bool)), ValueError, "valid"),
    (dict(gamma=-1.0), ValueError, "gamma"),
])
def test_dflash_loss_errors(kwargs, exc, name):
    args = dict(logits=torch.zeros(1, 3, 5), labels=torch.zeros(1, 3, dtype=torch.long),
                valid=torch.ones(1, 3, dtype=torch.bool))
    args.update(kwargs)
    with pytest.raises(exc, match=name):
        dflash_loss(**args)


def test_init_from_target_copies_layers_by_name():
    transformers = pytest.importorskip("transformers", reason="a transformers target needs the demo or train extra")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=128, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2)
    target = transformers.LlamaForCausalLM(cfg).eval()
    for p in target.parameters():  # norms start at one: make every tensor distinct
        torch.nn.init.normal_(p)
    d = DFlashDrafter(tiny_config())
    fc, q_norm = d.fc.weight.clone(), d.layers[0].self_attn.q_norm.weight.clone()
    copied = d.init_from_target(target)
    src = target.model.layers
    assert torch.equal(d.layers[0].self_attn.q_proj.weight, src[2].self_attn.q_proj.weight)  # the last two layers
    assert torch.equal(d.layers[1].mlp.down_proj.weight, src[3].mlp.down_proj.weight)
    assert torch.equal(d.layers[1].post_attention_layernorm.weight, src[3].post_attention_layernorm.weight)
    assert torch.equal(d.norm.weight, target.model.norm.weight) and "norm.weight" in copied
    assert torch.equal(d.fc.weight, fc) and torch.equal(d.layers[0].self_attn.q_norm.weight, q_norm)  # no source
    assert len(copied) == 2 * 9 + 1  # q, k, v, o, gate, up, down, two norms per layer; the final norm
    d.init_from_target(target, [0, 1])
    assert torch.equal(d.layers[0].self_attn.v_proj.weight, src[0].self_attn.v_proj.weight)
    with pytest.raises(ValueError, match="layer_ids"):
        d.init_from_target(target, [0, 9])


def test_an_out_of_vocabulary_anchor_is_named():
    d = DFlashDrafter(tiny_config())
    with pytest.raises(ValueError, match=rf"anchor_ids: expected token ids in \[0, {V}\)"):
        d.draft(torch.tensor([3, V]), torch.randn(2, 5, 2 * D), torch.randn(V, D))
