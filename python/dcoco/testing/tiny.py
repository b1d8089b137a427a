"""A tiny random Llama target (vocab 100, hidden 64, 4 layers) with a word-level chat tokenizer and a prompts
file, saved to a folder: `dcoco train --target DIR` runs on it offline in seconds. For tests and device smoke
runs (tests/gpu/gpu_train_smoke.py), never for results."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ("the a cat dog sun moon run jump big small red blue one two three four five six seven eight nine ten "
         "add sum code list write poem why how what when who is are was be and or not if then else for while "
         "return print value number word line story sea sky tree rain snow day night time fast slow hot cold "
         "up down left right go stop yes no good bad new old first last next more less many few all").split()
TAPS = (0, 2)  # target layers the drafter reads


def save_target(folder: str | Path, prompts: int = 10) -> Path:
    """Writes the model, its tokenizer and prompts.jsonl (random word strings) to folder; returns it."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    d = Path(folder)
    vocab = {t: i for i, t in enumerate(["<unk>", "<eos>", "<user>", "<bot>", *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>")
    tok.chat_template = "{% for m in messages %}<user> {{ m['content'] }} {% endfor %}<bot>"
    tok.save_pretrained(d)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=1,
                      bos_token_id=None, pad_token_id=1, tie_word_embeddings=True, initializer_range=0.4)
    LlamaForCausalLM(cfg).save_pretrained(d)
    g = torch.Generator().manual_seed(1)
    lines = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(n),), generator=g))
             for n in torch.randint(3, 12, (prompts,), generator=g)]
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines))
    return d


def train_args(folder: str | Path, cache: str | Path, out: str | Path, *extra: str) -> list[str]:
    """`dcoco train` arguments sized for the tiny target (short responses, a 1-layer block-8 drafter, a narrow
    corrector); extra are appended."""
    folder = Path(folder)
    return ["train", "--target", str(folder), "--prompts", str(folder / "prompts.jsonl"), "--cache-dir", str(cache),
            "--out", str(out), "--max-new-tokens", "24", "--gen-batch", "4", "--feat-batch", "4", "--layers", "1",
            "--target-layers", ",".join(map(str, TAPS)), "--block-size", "8", "--anchors", "8", "--candidates", "32",
            "--width", "16", "--mlp-hidden", "32", "--no-progress", *extra]


def save_zlab_drafter(folder: str | Path, drafter) -> Path:
    """drafter (a DFlashDrafter) written as z-lab publishes its drafters, by hand rather than through
    checkpoint.save: their config.json keys (a qwen3 config with auto_map, layer_types, block_size,
    num_target_layers and dflash_config) and bfloat16 tensors under their names. Checks that what we load and
    what vLLM serves is the published layout, not only our own writer's."""
    import torch
    from safetensors.torch import save_file

    c, d = drafter.config, Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "attention_bias": False, "attention_dropout": 0.0, "block_size": c.block_size, "bos_token_id": None,
           "dflash_config": {"mask_token_id": c.mask_token_id, "target_layer_ids": list(c.target_layer_ids)},
           "dtype": "bfloat16", "eos_token_id": None, "head_dim": c.head_dim, "hidden_act": "silu",
           "hidden_size": c.hidden_size, "initializer_range": 0.02, "intermediate_size": c.intermediate_size,
           "layer_types": ["full_attention"] * c.num_hidden_layers, "max_position_embeddings":
           c.max_position_embeddings, "max_window_layers": c.num_hidden_layers, "model_type": "qwen3",
           "num_attention_heads": c.num_attention_heads, "num_hidden_layers": c.num_hidden_layers,
           "num_key_value_heads": c.num_key_value_heads, "num_target_layers": c.num_target_layers,
           "rms_norm_eps": c.rms_norm_eps, "rope_scaling": None, "rope_theta": c.rope_theta, "sliding_window": None,
           "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False, "vocab_size": c.vocab_size}
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    names = [f"layers.{i}.{m}" for i in range(c.num_hidden_layers) for m in (
        "input_layernorm.weight", "post_attention_layernorm.weight", "mlp.down_proj.weight", "mlp.gate_proj.weight",
        "mlp.up_proj.weight", "self_attn.k_norm.weight", "self_attn.k_proj.weight", "self_attn.o_proj.weight",
        "self_attn.q_norm.weight", "self_attn.q_proj.weight", "self_attn.v_proj.weight")]
    names += ["fc.weight", "hidden_norm.weight", "norm.weight"]
    state = drafter.state_dict()
    save_file({n: state[n].detach().to(torch.bfloat16).contiguous() for n in names}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    return d
