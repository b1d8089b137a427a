"""A DSpark drafter written by dcoco (`dcoco export --format dspark`: a tiny DFlash drafter with a random DSparkHead)
against vllm-cpu 0.32.0's own DSpark code. Runs in .venv-vllm (scripts/test_vllm.sh).

What stock vllm-cpu 0.32.0 does with `speculative_config={"method": "dspark", ...}`: its speculative config takes
the checkpoint (architecture Qwen3DSparkModel, DFlash's [anchor, mask x N] block, the mask token and target layers
its DFlash readers find), then the engine refuses to start: only the V2 (GPU) model runner implements DSpark,
and a CPU runs V1, with adaptive verification or without (that needs V2 and full CUDA graphs too). So no greedy
output of a served DSpark drafter can be compared with target-only decoding here; the refusal is pinned below, and
a vLLM that lifts it fails that test.

What vLLM would serve is checked one level down, through its own code: its model loader builds Qwen3DSparkForCausalLM
from the export (strictly: every parameter from the checkpoint), every tensor lands where dcoco's drafter and head
keep it, and the model's Markov and confidence heads (markov_embed, markov_bias, compute_confidence: what V2's
DSpark speculator calls, slot by slot from the anchor) compute DSparkHead's logits, greedy walk and confidence."""

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup_vllm.sh)")

import torch
from safetensors.torch import save_file

from dcoco import cli
from dcoco.modeling import checkpoint
from dcoco.modeling.dspark import DSparkHead

from helpers.tiny_vllm import N, V, make_drafter, make_target

RANK, D = 16, 128  # the head's rank; the tiny drafter's hidden size


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny target, a DFlash drafter for it, and that drafter with a random DSpark head exported through the
    CLI in bfloat16 (a serving checkpoint's dtype)."""
    root = tmp_path_factory.mktemp("dspark")
    make_target(root / "target")
    make_drafter(root / "dflash", corrector=False)
    torch.manual_seed(11)
    head = DSparkHead(D, V, RANK)
    torch.nn.init.normal_(head.markov_w2.weight)  # a trained-looking head: its Markov term moves the argmax
    torch.nn.init.normal_(head.confidence_proj.weight, std=0.3)
    save_file(head.state_dict(), str(root / "head.safetensors"))
    assert cli.main(["export", str(root / "dflash"), str(root / "dspark"), "--format", "dspark", "--head",
                     str(root / "head.safetensors"), "--dtype", "bfloat16"]) == 0
    return root


@pytest.fixture(scope="module")
def spec(models):
    """vLLM's SpeculativeConfig for the export, as `--speculative-config` builds it (float32 serving)."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    target = ModelConfig(model=str(models / "target"), dtype="float32", max_model_len=256, skip_tokenizer_init=True)
    return SpeculativeConfig(method="dspark", model=str(models / "dspark"), num_speculative_tokens=N,
                             target_model_config=target, target_parallel_config=ParallelConfig())


@pytest.fixture(scope="module")
def loaded(spec):
    """vLLM's draft model built by its own loader from the export, on one CPU rank (its process group kept for the
    module's tests): (the model ready to run, every parameter as load_weights left it, before the CPU's GEMM
    packing empties the linear weights)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.model_executor.model_loader import base_loader, get_model
    from vllm.utils.network_utils import get_open_port

    config = VllmConfig(model_config=spec.target_model_config, parallel_config=spec.target_parallel_config)
    # a VllmConfig holding a dspark SpeculativeConfig is refused on this runner (test below); the model class
    # reads only the speculative config, so it is put in place after the checks
    object.__setattr__(config, "speculative_config", spec)
    raw, process = {}, base_loader.process_weights_after_loading

    def keeping_the_loaded_weights(model, *args):
        raw.update({k: v.detach().clone() for k, v in model.named_parameters()})
        return process(model, *args)

    with pytest.MonkeyPatch.context() as mp, set_current_vllm_config(config):
        mp.setattr(base_loader, "process_weights_after_loading", keeping_the_loaded_weights)
        mp.setattr(torch.accelerator, "empty_cache", lambda *a, **k: None)  # as vLLM's CPU runner sets it
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}")
        ensure_model_parallel_initialized(1, 1)
        try:
            yield get_model(vllm_config=config, model_config=spec.draft_model_config), raw
        finally:
            cleanup_dist_env_and_memory()  # the next module's engine sets up its own groups


def test_vllm_reads_the_export_as_a_qwen3_dspark_drafter(spec):
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
    from vllm.v1.worker.gpu.spec_decode.utils import get_parallel_drafting_token_id

    hf = spec.draft_model_config.hf_config
    assert spec.method == "dspark" and spec.use_eagle() and spec.parallel_drafting
    assert spec.draft_model_config.architectures == ["Qwen3DSparkModel"]
    assert get_parallel_drafting_token_id(hf) == V - 1  # the mask token of the drafter's block
    assert get_eagle3_aux_layers_from_config(spec) == (2, 3)  # target_layer_ids [1, 2]: those layers' outputs
    assert hf.sample_from_anchor is False  # the 1 + N block: the anchor is the verified token, the masks predict
    assert (hf.markov_rank, hf.enable_confidence_head, hf.confidence_head_with_markov) == (RANK, True, True)


@pytest.mark.parametrize("adaptive", [False, True])
def test_vllm_cpu_refuses_method_dspark_on_its_v1_runner(models, adaptive):
    """Pinned: vllm-cpu 0.32.0 runs the V1 model runner (its Triton has no CPU backend), which does not implement
    DSpark, nor adaptive verification. A vLLM that serves it here fails this test: then the served drafts and
    greedy losslessness can be tested like DFlash's (test_vllm.py)."""
    want = "Model Runner V1 does not support: dspark speculative decoding" + (
        ", adaptive draft verification" if adaptive else "")
    with pytest.raises(Exception, match=want):
        vllm.LLM(model=str(models / "target"), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
                 max_num_seqs=2, enforce_eager=True, seed=0, speculative_config={
                     "method": "dspark", "model": str(models / "dspark"), "num_speculative_tokens": N,
                     "enable_adaptive_verification": adaptive})


def test_vllms_loader_puts_every_tensor_where_dcoco_keeps_it(models, loaded):
    model, raw = loaded
    assert type(model).__name__ == "Qwen3DSparkForCausalLM" and model.model.confidence_head is not None
    drafter, head = checkpoint.load_dspark(models / "dspark", dtype=torch.float32)  # bf16 values, widened exactly
    d = {k: v for k, v in drafter.state_dict().items()}
    want = {"model.fc.weight": d["fc.weight"], "model.hidden_norm.weight": d["hidden_norm.weight"],
            "model.norm.weight": d["norm.weight"],
            "model.markov_head.markov_w1.weight": head.markov_w1.weight,
            "model.markov_head.markov_w2.weight": head.markov_w2.weight,
            "model.confidence_head.proj.weight": head.confidence_proj.weight,
            "model.confidence_head.proj.bias": torch.zeros(1)}
    for i in range(drafter.config.num_hidden_layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        want[q + "self_attn.qkv_proj.weight"] = torch.cat([d[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        want[q + "mlp.gate_up_proj.weight"] = torch.cat([d[p + "mlp.gate_proj.weight"], d[p + "mlp.up_proj.weight"]])
        for name in ("self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                     "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"):
            want[q + name] = d[p + name]
    # embed_tokens and lm_head are the target's, shared in at load; mask_embedding is an unused placeholder
    assert set(raw) == set(want) | {"model.embed_tokens.weight", "lm_head.weight", "model.mask_embedding"}
    for name, t in want.items():
        got = raw[name][:t.shape[0]]  # vocabulary-sized rows may be padded
        assert got.dtype == torch.float32 and torch.equal(got, t.detach().float()), name


def test_vllms_dspark_heads_compute_dsparkheads_logits_walk_and_confidence(models, loaded):
    """Random backbone outputs (hidden states and their logits U) for R requests: vLLM's heads, walked greedily
    slot by slot from each request's anchor as its DSpark speculator walks them, draft DSparkHead's tokens with its
    confidence, and the Markov term moves the argmax of U somewhere (the head is not idle)."""
    model, _ = loaded
    _, head = checkpoint.load_dspark(models / "dspark", dtype=torch.float32)
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, ())))
    R = 6
    hidden, U = torch.randn(R, N, D, generator=g), 2 * torch.randn(R, N, V, generator=g)
    anchors = torch.randint(0, V, (R,), generator=g)
    want_tokens, want_conf = head(hidden, U, anchors)
    with torch.no_grad():
        prev, tokens, embeds = anchors, [], []
        for k in range(N):
            e = model.markov_embed(prev)
            logits = U[:, k] + model.markov_bias(e)
            torch.testing.assert_close(logits, head.logits(U[:, k:k + 1], prev[:, None])[:, 0], rtol=1e-5, atol=1e-5)
            prev = logits.argmax(-1)
            tokens.append(prev)
            embeds.append(e)
        conf = model.compute_confidence(hidden.flatten(0, 1), torch.stack(embeds, 1).flatten(0, 1)).view(R, N)
    assert torch.equal(torch.stack(tokens, 1), want_tokens)
    torch.testing.assert_close(conf, want_conf, rtol=1e-5, atol=1e-6)
    assert bool((want_tokens != U.argmax(-1)).any())
