"""The tiny vLLM world the serving tests share: a random Qwen3 target, DFlash/DCOCO drafters and a byte-level chat
tokenizer written to folders, and greedy or sampled generation with vLLM's spec-decode counters. vLLM itself is
imported only inside the functions that run it."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from dcoco import Corrector
from dcoco.modeling import checkpoint
from dcoco.modeling.dflash import DFlashConfig, DFlashDrafter
from dcoco.modeling.draft_vocab import DraftHead
from dcoco.testing import tiny

V, N = 512, 3  # vocabulary; drafted slots (block 4)
PROMPTS = [[5, 17, 99, 3, 250, 41], [300, 2, 2, 77, 8, 120, 64, 9, 11]]


def make_target(path, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      initializer_range=0.2)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


def make_drafter(path, corrector: bool = True, drop: str | None = None, zlab: bool = False, anchor: bool = False,
                 shortlist: torch.Tensor | None = None, target: Path | None = None):
    """A tiny drafter checkpoint: with a random corrector that changes drafts (anchor: an anchor-aware one, which
    re-ranks slot 1 too), without one, or z-lab's layout; drop: one corrector tensor left out; shortlist: a draft
    head over these ids, rows of the head of the target saved in the folder target."""
    torch.manual_seed(1)
    d = DFlashDrafter(DFlashConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=32, vocab_size=V, mask_token_id=V - 1,
                                   target_layer_ids=[1, 2], num_target_layers=4, block_size=N + 1,
                                   max_position_embeddings=512))
    with torch.no_grad():  # flatter logits: the residual of the mask token's embedding no longer wins every slot
        d.norm.weight.mul_(0.1)
    if zlab:  # z-lab's published layout, written by hand
        tiny.save_zlab_drafter(path, d)
        return
    if shortlist is not None:
        from safetensors.torch import load_file

        head = load_file(str(Path(target) / "model.safetensors"))["model.embed_tokens.weight"]  # tied
        d.draft_head = DraftHead.from_target(head.float(), shortlist)
    c = None
    if corrector:
        c = Corrector(128, num_candidates=8, width=32, mlp_hidden=64, anchor_transition=anchor)
        torch.nn.init.normal_(c.mlp[2].weight, std=2.0)  # a trained-looking output layer: it overrides the argmax
    checkpoint.save(path, d, c)
    if drop:  # a partial checkpoint: one corrector tensor missing
        from safetensors.torch import load_file, save_file
        t = load_file(str(path / "model.safetensors"))
        del t[drop]
        save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})


def generate(llm, temperature=0.0, tokens=24, prompts=PROMPTS, seeds=None):
    """Each prompt's output tokens; tokens: the length of every output, or one per prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    seeds = seeds or [3] * len(prompts)
    lengths = tokens if isinstance(tokens, list) else [tokens] * len(prompts)
    sp = [SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True, seed=s, detokenize=False)
          for s, n in zip(seeds, lengths)]
    return [list(o.outputs[0].token_ids)
            for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)]


def spec_counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name] = m.values if hasattr(m, "values") else m.value
    return out


def close(llm):
    del llm
    gc.collect()


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SUITES = {"gsm8k": [["Tom has 3 apples and buys 5 more. How many apples does he have?"],
                    ["A train travels 60 km in 1.5 hours. What is its average speed?"],
                    ["What is 17 times 23?"]],
          "humaneval": [["def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n"],
                        ["def is_even(n):\n    \"\"\"True when n is even.\"\"\"\n"]],
          "mt-bench": [["Write a haiku about rain.", "Now rewrite it about snow."],
                       ["Name three primes.", "Which of them is the largest?"]]}


def make_tokenizer(path: Path) -> None:
    """Bytes as ids 0-255, ChatML markers, placeholders up to V: what vLLM needs to serve chat completions."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", *(f"<|x{i}|>" for i in range(V - 258))])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", chat_template=CHATML).save_pretrained(path)
