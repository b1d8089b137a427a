"""The vLLM plugin on real vLLM (vllm-cpu 0.32.0, the V1 runner; scripts/setup_vllm.sh makes .venv-vllm, and
scripts/test_vllm.sh runs this module there). A tiny random Qwen3 target and tiny DFlash/DCOCO drafters are built
in a temp dir: greedy output with DCOCO equals output without speculation (on both backends), temperature 1
completes, the spec-decode counters come through vLLM's metrics, and bad checkpoints fail at load with dcoco's
message.
The engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that load errors surface as exceptions."""

import gc
import json
import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup_vllm.sh)")

import torch  # noqa: E402

import dcoco  # noqa: E402
from dcoco import Corrector, checkpoint, vllm_plugin  # noqa: E402
from dcoco.dflash import DFlashConfig, DFlashDrafter  # noqa: E402

V, N = 512, 3  # vocabulary; drafted slots (block 4)
PROMPTS = [[5, 17, 99, 3, 250, 41], [300, 2, 2, 77, 8, 120, 64, 9, 11]]


def _target(path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      initializer_range=0.2)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


def _drafter(path, corrector: bool = True, drop: str | None = None):
    torch.manual_seed(1)
    d = DFlashDrafter(DFlashConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=32, vocab_size=V, mask_token_id=V - 1,
                                   target_layer_ids=[1, 2], num_target_layers=4, block_size=N + 1,
                                   max_position_embeddings=512))
    c = None
    if corrector:
        c = Corrector(128, num_candidates=8, width=32, mlp_hidden=64)
        torch.nn.init.normal_(c.mlp[2].weight, std=2.0)  # a trained-looking output layer: it overrides the argmax
    checkpoint.save(path, d, c)
    if drop:  # a partial checkpoint: one corrector tensor missing
        from safetensors.torch import load_file, save_file
        t = load_file(str(path / "model.safetensors"))
        del t[drop]
        save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    _target(root / "target")
    _drafter(root / "dcoco")
    _drafter(root / "dflash", corrector=False)
    _drafter(root / "partial", drop="corrector.mlp.0.weight")
    return root


def _llm(root, drafter=None, n=N):
    spec = None if drafter is None else {"method": "dflash", "model": str(root / drafter),
                                         "num_speculative_tokens": n}
    return vllm.LLM(model=str(root / "target"), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
                    max_num_seqs=4, enforce_eager=True, disable_log_stats=False, speculative_config=spec, seed=0)


def _generate(llm, temperature=0.0, tokens=24):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=temperature, max_tokens=tokens, ignore_eos=True, seed=3, detokenize=False)
    return [o.outputs[0].token_ids for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], sp)]


def _spec_counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name] = m.values if hasattr(m, "values") else m.value
    return out


def _drafter_info(worker):
    m = worker.model_runner.drafter.model
    return type(m).__name__, (None if m.corrector is None else float(m.corrector.mlp[2].weight.abs().sum()))


def _count_calls(worker):
    m = worker.model_runner.drafter.model
    m.dcoco_calls, inner = 0, m.compute_logits

    def counted(h):
        m.dcoco_calls += 1
        return inner(h)
    m.compute_logits = counted


def _calls(worker):
    return worker.model_runner.drafter.model.dcoco_calls


def _corrected(worker):
    """On random drafter hidden states of 4 requests: the stock DFlash argmax and what the hook returns."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    m = worker.model_runner.drafter.model
    h = torch.randn(4 * N, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    base = DFlashQwen3ForCausalLM.compute_logits(m, h).argmax(-1).view(4, N)
    out = m.compute_logits(h)
    return base.tolist(), out.argmax(-1).view(4, N).tolist(), torch.isfinite(out).sum(-1).tolist()


def _close(llm):
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def plain_greedy(models):
    llm = _llm(models)
    out = [list(t) for t in _generate(llm)]
    _close(llm)
    return out


def test_plugin_registers_idempotently():
    assert vllm_plugin.register() and vllm_plugin.register()
    assert vllm_plugin.ARCHITECTURE in vllm.ModelRegistry.get_supported_archs()
    assert vllm_plugin.version_error(vllm.__version__) is None
    assert "not supported" in vllm_plugin.version_error("0.30.1")


def test_dcoco_greedy_is_lossless_and_counted(models, plain_greedy):
    llm = _llm(models, "dcoco")
    (name, w), = llm.collective_rpc(_drafter_info)
    assert name == "DFlashDCOCOForCausalLM" and w > 0  # the checkpoint's corrector, loaded
    llm.collective_rpc(_count_calls)
    assert [list(t) for t in _generate(llm)] == plain_greedy
    assert llm.collective_rpc(_calls)[0] > 0  # vLLM drafted through the hook
    (base, corrected, finite), = llm.collective_rpc(_corrected)
    assert all(f == 1 for f in finite)  # one finite logit per slot: a point mass at the corrected token
    assert [b[0] for b in base] == [c[0] for c in corrected]  # slot 1 keeps the argmax (prefix-first)
    assert base != corrected  # the corrector re-selected later slots
    c = _spec_counters(llm)
    drafts = c["vllm:spec_decode_num_drafts"]
    assert drafts > 0 and c["vllm:spec_decode_num_draft_tokens"] == N * drafts
    assert len(c["vllm:spec_decode_num_accepted_tokens_per_pos"]) == N
    assert sum(c["vllm:spec_decode_num_accepted_tokens_per_pos"]) == c["vllm:spec_decode_num_accepted_tokens"]
    sampled = _generate(llm, temperature=1.0)
    assert all(len(t) == 24 and all(0 <= x < V for x in t) for t in sampled)
    with dcoco.use_backend("native"):  # the same engine on the native backend: what every GPU runs today
        before = llm.collective_rpc(_calls)[0]
        assert [list(t) for t in _generate(llm)] == plain_greedy
        assert llm.collective_rpc(_calls)[0] > before
        (_, corrected_native, _), = llm.collective_rpc(_corrected)
    assert corrected_native == corrected
    _close(llm)


def test_plain_dflash_checkpoint_still_serves(models, plain_greedy):
    llm = _llm(models, "dflash")
    assert [list(t) for t in _generate(llm)] == plain_greedy
    _close(llm)


def test_partial_checkpoint_fails_at_load(models):
    with pytest.raises(Exception, match=r"corrector\.mlp\.0\.weight"):
        _llm(models, "partial")
    gc.collect()


def test_checkpoint_config_is_what_vllm_reads(models):
    cfg = json.loads((models / "dcoco" / "config.json").read_text())
    assert cfg["architectures"] == [vllm_plugin.ARCHITECTURE]
    assert cfg["dflash_config"]["mask_token_id"] == V - 1 and cfg["block_size"] == N + 1
