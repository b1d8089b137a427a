"""A tiny random Llama target (vocab 100, hidden 64, 4 layers) with a word-level chat tokenizer and a prompts
file, saved to a folder: `dcoco train --target DIR` runs on it offline in seconds. For tests and device smoke
runs (bench/gpu_train_smoke.py), never for results."""

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
