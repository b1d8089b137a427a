"""memplan's estimate against real modules on the CPU: parameter/gradient/optimizer rows exactly, the target's
parameter count against transformers' own model, activations against what autograd saves in one
Objective.forward; and the Qwen3-8B recipe's plan (z-lab's drafter, 8 ranks of 80 GiB)."""

import json
import re

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from dcoco.modeling import dflash, head
from dcoco.train import memplan
from dcoco.testing import tiny
from dcoco.corrector import Corrector
from dcoco.modeling.dflash import DFlashConfig, DFlashDrafter
from dcoco.train.training import Objective, TrainConfig
from helpers import ROOT

CONFIGS = ROOT / "recipes" / "configs"
GIB = 2 ** 30


def qwen3(tie: bool = False) -> Qwen3Config:
    return Qwen3Config(vocab_size=512, hidden_size=96, intermediate_size=160, num_hidden_layers=4,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=32, tie_word_embeddings=tie)


def drafter_for(t, layers: int, block: int, taps: list[int]) -> DFlashConfig:
    return DFlashConfig(hidden_size=t.hidden_size, intermediate_size=t.intermediate_size, num_hidden_layers=layers,
                        num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
                        head_dim=getattr(t, "head_dim", None), vocab_size=t.vocab_size, mask_token_id=t.vocab_size - 1,
                        target_layer_ids=taps, num_target_layers=t.num_hidden_layers, block_size=block)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return AutoConfig.from_pretrained(tiny.save_target(tmp_path_factory.mktemp("tiny")))


def setup(t, c: DFlashConfig, cfg: TrainConfig, S: int, feature_dtype: torch.dtype):
    """The modules train() builds (float32, trainable per mode) and a batch of S tokens with cfg.anchors anchors
    per sequence, all real and inside the response (what the estimate assumes)."""
    torch.manual_seed(0)
    drafter = DFlashDrafter(c).requires_grad_(cfg.mode != "corrector")
    drafter.grad_checkpoint = cfg.grad_checkpoint
    corrector = None
    if cfg.mode != "drafter":
        corrector = Corrector(c.hidden_size, cfg.num_candidates, cfg.width, cfg.mlp_hidden)
        corrector.requires_grad_(True)
        torch.nn.init.normal_(corrector.mlp[2].weight)  # nonzero, so that every corrector weight gets a gradient
    N, A, V = cfg.seqs_per_step, cfg.anchors, c.vocab_size
    batch = {"ids": torch.randint(0, V, (N, S)), "labels": torch.randint(0, V, (N, S)),
             "hidden": torch.randn(N, S, len(c.target_layer_ids) * c.hidden_size).to(feature_dtype),
             "response": torch.ones(N, S, dtype=torch.bool),
             "anchors": torch.stack([torch.randperm(S - 1)[:A].sort().values for _ in range(N)]),
             "anchor_ok": torch.ones(N, A, dtype=torch.bool)}
    return Objective(drafter, corrector, cfg), batch, torch.randn(V, c.hidden_size), torch.randn(V, c.hidden_size)


def saved_bytes(objective, batch, embed, lm_head, monkeypatch) -> int:
    """Bytes of the unique storages one forward keeps for backward: what autograd saves, what checkpointed
    chunks and layers hold for their recompute, and the batch's features. Weights are counted elsewhere."""
    skip = {t.untyped_storage().data_ptr() for t in (*objective.parameters(), embed, lm_head)}
    kept = {batch["hidden"].untyped_storage().data_ptr(): batch["hidden"].untyped_storage().nbytes()}

    def keep(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            kept[s.data_ptr()] = s.nbytes()
        return t

    def checkpoint(fn, *args, **kw):  # its inputs live in a closure, out of the hooks' sight
        for a in args:
            for t in a if isinstance(a, tuple) else (a,):
                if isinstance(t, torch.Tensor):
                    keep(t)
        return torch.utils.checkpoint.checkpoint(fn, *args, **kw)

    for module in (head, dflash):
        monkeypatch.setattr(module, "checkpoint", checkpoint)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        objective(batch, embed, lm_head)
    return sum(kept.values())


def rows(plan: memplan.Plan) -> dict[str, int]:
    return {n: b for n, b, _ in plan.rows}


# (target, drafter layers, block, taps, TrainConfig, seq_len, online); features: the target's float32 when online,
# the corpus's float16 otherwise
CASES = {
    "llama-tied-joint": (None, 1, 8, [0, 2], dict(mode="joint", anchors=8, num_candidates=16, width=16,
                                                 mlp_hidden=32), 48, True),
    "qwen3-gqa-drafter-chunked": (qwen3, 2, 16, [0, 1, 3], dict(mode="drafter", anchors=6, logit_chunk=32), 64, False),
    "qwen3-gqa-joint-chunked": (qwen3, 2, 8, [1, 3], dict(mode="joint", anchors=10, seqs_per_step=3,
                                                          logit_chunk=50, width=32, mlp_hidden=48), 40, True),
    "qwen3-gqa-joint-grad-checkpoint": (qwen3, 3, 8, [0, 2], dict(mode="joint", anchors=8, grad_checkpoint=True,
                                                                  logit_chunk=40), 48, True),
    "qwen3-gqa-corrector": (qwen3, 2, 16, [1, 3], dict(mode="corrector", anchors=5, num_candidates=8), 32, False),
}


@pytest.mark.parametrize("name", CASES)
def test_activations_match_autograd(name, llama, monkeypatch):
    make, layers, block, taps, kw, S, online = CASES[name]
    t = llama if make is None else make()
    c, cfg = drafter_for(t, layers, block, taps), TrainConfig(**kw)
    objective, batch, embed, head = setup(t, c, cfg, S, torch.float32 if online else torch.float16)
    measured = saved_bytes(objective, batch, embed, head, monkeypatch)
    r = rows(memplan.estimate(t, c, cfg, seq_len=S, online=online, cuda=False))
    # a frozen drafter saves nothing: its row is the no_grad forward's working set, not a saved tensor
    estimated = sum(r[k] for k in memplan.ACTIVATION_ROWS if cfg.mode != "corrector" or k != "drafter activations")
    print(f"{name}: measured {measured} B, estimated {estimated} B ({estimated / measured - 1:+.1%})")
    assert abs(estimated / measured - 1) <= 0.05


@pytest.mark.parametrize("name", ["llama-tied-joint", "qwen3-gqa-drafter-chunked", "qwen3-gqa-joint-chunked",
                                  "qwen3-gqa-joint-grad-checkpoint"])
def test_autocast_formulas_under_cpu_bf16(name, llama, monkeypatch):
    """The cuda=True rows (bf16 matmul outputs and autocast's copies) against a CPU forward under bf16 autocast:
    the same casts as CUDA's for Linear and SDPA, with bf16 features as online capture gives. The corrector runs
    its fused op here and the native path on CUDA; both keep the same candidates (int64 ids, bf16 logits)."""
    make, layers, block, taps, kw, S, _ = CASES[name]
    t = llama if make is None else make()
    c, cfg = drafter_for(t, layers, block, taps), TrainConfig(**kw)
    objective, batch, embed, head = setup(t, c, cfg, S, torch.bfloat16)
    head = head.bfloat16()  # train() keeps the LM head in bf16 on CUDA
    with torch.autocast("cpu", torch.bfloat16):
        measured = saved_bytes(objective, batch, embed, head, monkeypatch)
    r = rows(memplan.estimate(t, c, cfg, seq_len=S, cuda=True))
    # checkpointed layers keep no weight copies for backward: the cache holds them until the forward ends
    copies = 0 if cfg.grad_checkpoint else r["autocast bf16 weight copies"]
    estimated = sum(r[k] for k in memplan.ACTIVATION_ROWS) + copies
    print(f"{name} (bf16): measured {measured} B, estimated {estimated} B ({estimated / measured - 1:+.1%})")
    assert abs(estimated / measured - 1) <= 0.05


@pytest.mark.parametrize("mode", ["drafter", "corrector", "joint"])
def test_weights_gradients_optimizer_exact(mode):
    t = qwen3()
    c = drafter_for(t, 2, 8, [1, 3])
    cfg = TrainConfig(mode=mode, anchors=4, width=16, mlp_hidden=24)
    objective, batch, embed, head = setup(t, c, cfg, 24, torch.float32)
    params = [p for p in objective.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    objective(batch, embed, head)["loss"].backward()
    opt.step()
    r = rows(memplan.estimate(t, c, cfg, seq_len=24, cuda=False))
    modules = {"drafter": objective.drafter, "corrector": objective.corrector}
    for name, m in modules.items():
        ps = list(m.parameters()) if m is not None else []
        assert r[f"{name} weights"] == sum(p.nbytes for p in ps)
        assert r[f"{name} gradients"] == sum(p.grad.nbytes for p in ps if p.grad is not None)
        assert r[f"{name} AdamW moments"] == sum(opt.state[p]["exp_avg"].nbytes + opt.state[p]["exp_avg_sq"].nbytes
                                                 for p in ps if p in opt.state)
    assert r["DDP gradient buckets"] == 0
    ddp = rows(memplan.estimate(t, c, cfg, world=2, seq_len=24, cuda=False))["DDP gradient buckets"]
    assert ddp == 0  # gradient_as_bucket_view: the buckets are the gradients
    cached = rows(memplan.estimate(t, c, cfg, seq_len=24, cuda=True))["autocast bf16 weight copies"]
    linear = sum(m.weight.numel() for m in objective.drafter.layers.modules() if isinstance(m, torch.nn.Linear))
    assert cached == (2 * linear if mode != "corrector" else 0)


@pytest.mark.parametrize("make", [lambda: LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96,
                                                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                      tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
                                  lambda: qwen3(tie=False),
                                  lambda: Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96,
                                                      num_hidden_layers=3, num_attention_heads=4,
                                                      num_key_value_heads=2)])
def test_target_weights_match_transformers(make):
    t = make()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(t)
    dec, Vd = model.model, t.vocab_size * t.hidden_size
    c, cfg = drafter_for(t, 1, 4, [1]), TrainConfig(anchors=4)

    def count(m):
        return sum(p.numel() for p in m.parameters())

    def row(**kw):
        return rows(memplan.estimate(t, c, cfg, **kw))["target weights (online capture)"]

    # unsharded, recipe.run moves the whole causal LM (an untied LM head included) to the device
    assert row(cuda=False) == 4 * count(model) and row(cuda=True) == 2 * count(model)
    # sharded: 1/world of the decoder + the gathered root (embedding, final norm) and two layers + the LM head copy
    root = count(dec.embed_tokens) + count(dec.norm)
    assert row(world=4, shard_target=True) == 2 * (-(-count(dec) // 4) + root + 2 * count(dec.layers[0]) + Vd)
    assert row(world=1, shard_target=True) == 2 * (count(dec) + Vd)  # one rank: the decoder and a head copy
    assert row(online=False) == 0


def test_plan_format_fits_and_dict(llama):
    c, cfg = drafter_for(llama, 1, 8, [0, 2]), TrainConfig(anchors=8)
    plan = memplan.estimate(llama, c, cfg, seq_len=48, cuda=True)
    assert plan.device_bytes is None and plan.fits() is None and "fit" not in plan.format()
    assert plan.total == sum(b for _, b, _ in plan.rows) > memplan.CUDA_SLACK
    big = memplan.estimate(llama, c, cfg, seq_len=48, device_bytes=80 * GIB)
    small = memplan.estimate(llama, c, cfg, seq_len=48, device_bytes=GIB)
    assert big.fits() and not small.fits() and big.fits(headroom=1.0)
    for bad in (0, 1.5, True, "0.9"):
        with pytest.raises(ValueError, match="^headroom:"):
            big.fits(bad)
    assert "fits in 80.0 GiB" in big.format() and "does not fit in 1.0 GiB" in small.format()
    lines = big.format().splitlines()
    assert lines[-2].startswith("total") and len(lines) == len(big.rows) + 3
    gib_ends = {re.match(r"^.+? +\d+\.\d\d  ", line).end() for line in lines[1:-1]}
    assert gib_ends == {lines[0].index("GiB") + 5}  # right-aligned under the header
    d = json.loads(json.dumps(big.to_dict()))
    assert d["total_bytes"] == big.total and d["fits"] is True and len(d["rows"]) == len(big.rows)
    assert {"component", "bytes", "gib", "how"} == set(d["rows"][0])


@pytest.mark.parametrize("kw, name", [
    (dict(world=0), "world"), (dict(world="2"), "world"), (dict(world=True), "world"),
    (dict(seq_len=0), "seq_len"), (dict(seq_len=2.0), "seq_len"), (dict(target={"hidden_size": 64}), "target"),
    (dict(drafter={}), "drafter"), (dict(cfg=None), "cfg"), (dict(device_bytes=-1), "device_bytes"),
    (dict(shard_target="yes"), "shard_target"), (dict(online=1), "online"), (dict(cuda=None), "cuda"),
    (dict(target=qwen3()), "drafter"),  # a drafter for another target
])
def test_bad_arguments(kw, name, llama):
    args = dict(target=llama, drafter=drafter_for(llama, 1, 8, [0, 2]), cfg=TrainConfig(anchors=8))
    args.update(kw)
    with pytest.raises(ValueError, match=f"^{name}:"):
        memplan.estimate(**args)


@pytest.mark.parametrize("shard", [False, True])
def test_qwen3_8b_zlab_fits_80gib(shard):
    target = AutoConfig.from_pretrained(CONFIGS / "Qwen3-8B")
    drafter = DFlashConfig.from_dict(json.loads((CONFIGS / "Qwen3-8B-DFlash-b16" / "config.json").read_text()))
    assert drafter.target_layer_ids == [1, 9, 17, 25, 33] and drafter.mask_token_id == 151669
    plan = memplan.estimate(target, drafter, TrainConfig(mode="joint", anchors=512, seqs_per_step=2), world=8,
                            seq_len=3072, shard_target=shard, cuda=True, device_bytes=80 * GIB)
    print(plan.format())
    r = rows(plan)
    assert r["drafter weights"] == 4 * 1_048_626_432  # DFlashDrafter on the meta device
    if not shard:  # Qwen3ForCausalLM on the meta device: 8_190_735_360 parameters, LM head included
        assert r["target weights (online capture)"] == 2 * 8_190_735_360
    assert plan.fits()


def test_cli_dry_run_of_the_qwen3_recipe(capsys, tmp_path):
    """What docs/training.md shows: the recipe's two stages planned offline from configs alone, both fitting."""
    from dcoco import cli

    root = ROOT / "recipes"
    assert cli.main(["train", "--config", str(root / "qwen3-8b-zlab.toml"), "--dry-run", "--world-size", "8",
                     "--gpu-memory", "80", "--target", str(root / "configs" / "Qwen3-8B"), "--init",
                     str(root / "configs" / "Qwen3-8B-DFlash-b16"), "--plan-json", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "plan.json").read_text())["stages"]
    assert [p["mode"] for p in saved] == ["corrector", "joint"] and all(p["fits"] for p in saved)
    assert saved[1]["total_bytes"] == sum(r["bytes"] for r in saved[1]["rows"])
    assert out.count("sequences of 3072 tokens") == 2 and out.count("fits in 80.0 GiB") == 2
    assert "corrector, 8 rank(s)" in out and "joint, 8 rank(s)" in out
