"""Tiny random models in memory: a Llama target, a DFlash drafter's config and a corrector that re-picks."""

from __future__ import annotations

import torch

from dcoco.corrector import Corrector
from dcoco.modeling.dflash import DFlashConfig

BS = 6  # block size: 5 drafted slots, so max_new_tokens 7 and 23 are not multiples of it
PROMPTS = ([3, 17, 5, 9], [40, 2, 2, 11, 60, 7, 1, 33])


def llama(vocab: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=None,
                      bos_token_id=None, pad_token_id=None, tie_word_embeddings=True, initializer_range=0.4)
    return LlamaForCausalLM(cfg).eval()


def dflash_cfg(vocab: int) -> DFlashConfig:
    return DFlashConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=vocab, mask_token_id=0, target_layer_ids=[0, 2],
                        num_target_layers=4, block_size=BS)


def corrector(seed: int = 0, anchor: bool = False) -> Corrector:
    torch.manual_seed(seed)
    c = Corrector(64, num_candidates=8, width=16, mlp_hidden=32, anchor_transition=anchor)
    torch.nn.init.normal_(c.mlp[2].weight, std=4.0)  # non-zero: it does re-pick candidates
    return c.eval()


SMALL_V, SMALL_D = 96, 32  # small_drafter's vocabulary and width


def small_drafter(seed: int = 0):
    """A one-layer DFlash drafter, width SMALL_D over SMALL_V tokens, two target layers, blocks of 4."""
    from dcoco.modeling.dflash import DFlashDrafter

    torch.manual_seed(seed)
    return DFlashDrafter(DFlashConfig(hidden_size=SMALL_D, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=SMALL_V,
                                      mask_token_id=SMALL_V - 1, target_layer_ids=[0, 1], num_target_layers=2,
                                      block_size=4, rope_theta=10000.0))


def small_checkpoint(out):
    """small_drafter with a trained-looking corrector (a random output layer), saved as a DCOCO checkpoint at out."""
    from dcoco.modeling import checkpoint

    c = Corrector(SMALL_D, num_candidates=8, width=16, mlp_hidden=32)
    torch.nn.init.normal_(c.mlp[2].weight)
    checkpoint.save(out, small_drafter(), c)
    return out
