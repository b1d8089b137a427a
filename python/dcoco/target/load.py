"""The target model by name: the embedded SmolLM2-135M-Instruct, or any transformers causal LM."""

from __future__ import annotations

import torch

from . import smollm2

SMOLLM2 = "smollm2"


def load_target(name: str = SMOLLM2, dtype: torch.dtype | None = None):
    """(tokenizer, model) in eval mode: "smollm2" is the embedded target, anything else a transformers
    causal LM directory or hub id. dtype: the weights' dtype (default: transformers' default)."""
    if name == SMOLLM2:
        tok, model = smollm2.load()
        return tok, model if dtype is None else model.to(dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {} if dtype is None else {"dtype": dtype}
    return AutoTokenizer.from_pretrained(name), AutoModelForCausalLM.from_pretrained(name, **kw).eval()
