"""What the vLLM plugin adds to a draft call, as plain tensor ops with no vLLM import: the top-K of the draft
logits, the corrector over each request's N slots, and the hand-back of the corrected tokens into the logits.

vllm_model.py calls these; the device check (tests/gpu/gpu_hook.py) captures them in a CUDA graph and
bench/models/launch_model.py counts their launches, so all three see the same ops."""

from __future__ import annotations

import torch

from ..corrector import Corrector
from ..ops.select import sample, select

# profiler regions of the hook's parts (the corrector's own is vllm_model.OP_NAME), for a draft step's cost split
TOPK = "dcoco_topk"
WRITE = "dcoco_write"


def tokens(corrector: Corrector, embed: torch.Tensor, selection: str, hidden: torch.Tensor, cand_ids: torch.Tensor,
           cand_logits: torch.Tensor, anchor_ids: torch.Tensor | None = None) -> torch.Tensor:
    """tokens (R,N) int64: the corrected draft for hidden (R,N,d), cand_ids / cand_logits (R,N,K), by the rule
    selection (greedy: the corrector's walk over the prepared table; global / geometric: the whole grid). An
    anchor-aware corrector (anchor_transition) takes hidden (R,N+1,d), position 0 the anchor's, and anchor_ids (R,)."""
    if selection == "greedy":
        return corrector(hidden, cand_ids, cand_logits, embed, anchor_ids)[1]
    scores = corrector.score(hidden, cand_ids, cand_logits, embed, anchor_ids)
    first, grid = corrector.walk_inputs(scores, cand_logits)
    ranks = select(grid, first, selection)
    return cand_ids.gather(2, ranks[..., None])[..., 0]


def sampled(corrector: Corrector, embed: torch.Tensor, hidden: torch.Tensor, cand_ids: torch.Tensor,
            cand_logits: torch.Tensor, temperature: torch.Tensor, anchor_ids: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled walk (select.sample) over the corrector's scores: tokens (R,N) int64 and their proposal
    q (R,N,K) float32 over the candidates, for hidden (R,N,d), cand_ids / cand_logits (R,N,K) and temperature (R,)
    per request (0: greedy). With the anchor transition, hidden and anchor_ids as in tokens()."""
    scores = corrector.score(hidden, cand_ids, cand_logits, embed, anchor_ids)
    first, grid = corrector.walk_inputs(scores, cand_logits)
    ranks, q = sample(grid, first, temperature)
    return cand_ids.gather(2, ranks[..., None])[..., 0], q


def proposal(cand_ids: torch.Tensor, q: torch.Tensor, vocab: int) -> torch.Tensor:
    """q (rows, K) over the candidates cand_ids (rows, K) as the dense (rows, vocab) float32 distribution vLLM's V1
    rejection sampler reads: zero off the candidates."""
    return q.new_zeros(q.shape[0], vocab).scatter_(1, cand_ids, q)


def candidates(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (rows, k) top-K ids and their logits as float32, from logits in their own dtype, rank 0 being the
    drafter's own pick, `logits.argmax(-1)` (see argmax_first)."""
    top = logits.topk(min(k, logits.shape[-1]), dim=-1)
    values = top.values.float()
    return argmax_first(top.indices, values), values


def argmax_first(ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """ids (rows, k) of a top-K sorted by value, with the entries tied at the maximum put in ascending id order, so
    rank 0 is the lowest of them: what an argmax over the vocabulary picks, and vLLM's argmax reduction over vocab
    shards. A corrector that keeps rank 0 then drafts exactly what DFlash drafts: topk promises no order among
    ties, and bf16 logits tie often. Exact whenever at most k entries tie at the maximum (the top-K then holds them
    all); with more, rank 0 is one of them. The tied entries are a prefix of the sorted list, so the values stay
    as they are. Over the (rows, k) lists only: an argmax over the logits would read them all again."""
    tied = values == values[:, :1]
    low = torch.where(tied, ids, torch.iinfo(ids.dtype).max).sort(-1).values  # the tied ids first, ascending
    return torch.where(tied, low, ids)


def hand_back(logits: torch.Tensor, tokens: torch.Tensor, point_mass: bool) -> torch.Tensor:
    """Writes the (rows,) chosen tokens into logits (rows, V) in place: +inf there when only an argmax reads
    them, or a point mass (0 there, -inf elsewhere) when vLLM samples them or reads them as a proposal."""
    if point_mass:
        return logits.fill_(float("-inf")).scatter_(1, tokens[:, None], 0.0)
    return logits.scatter_(1, tokens[:, None], float("inf"))


def blocks(hidden: torch.Tensor, slots: int, anchor_hidden: torch.Tensor | None = None) -> torch.Tensor:
    """The (R*N, d) drafted rows, request-major, N = slots, as the corrector's (R,N,d) blocks; with anchor_hidden
    (R, d), the drafter's hidden state at each block's anchor, as (R,N+1,d), the anchor first."""
    h = hidden.view(hidden.shape[0] // slots, slots, -1)
    if anchor_hidden is None:
        return h
    if anchor_hidden.shape != (h.shape[0], h.shape[2]):
        raise ValueError(f"anchor_hidden: expected one ({h.shape[0]}, {h.shape[2]}) row per request of the "
                         f"{hidden.shape[0]} drafted rows ({slots} slots each), got {tuple(anchor_hidden.shape)}")
    return torch.cat([anchor_hidden[:, None], h], 1)


def rows(correct, slots: int):
    """correct over (R,N,...) blocks as the hook calls it, over rows request-major: hidden (R*N, d), ids and
    values (R*N, K) -> tokens (R*N,), N = slots. An anchor-aware correct also takes anchor_hidden (R, d) and
    anchor_ids (R,), the block's first position (see blocks()), and is called as correct(hidden, ids, values,
    anchor_ids) on the (R,N+1,d) blocks; without them the call is the paper's, unchanged."""
    def by_rows(hidden: torch.Tensor, ids: torch.Tensor, values: torch.Tensor,
                anchor_hidden: torch.Tensor | None = None, anchor_ids: torch.Tensor | None = None) -> torch.Tensor:
        if (anchor_hidden is None) != (anchor_ids is None):
            raise ValueError("anchor_hidden, anchor_ids: pass both (an anchor-aware corrector) or neither")
        R, K = hidden.shape[0] // slots, ids.shape[-1]
        h, ids, values = blocks(hidden, slots, anchor_hidden), ids.view(R, slots, K), values.view(R, slots, K)
        anchor = () if anchor_ids is None else (anchor_ids,)
        # reshape: a view of the paper's tokens; a copy of an anchor-aware corrector's (its anchor column sliced off)
        return correct(h, ids, values, *anchor).reshape(-1)
    return by_rows


def on_logits(correct, hidden: torch.Tensor, logits: torch.Tensor, k: int, point_mass: bool,
              anchor_hidden: torch.Tensor | None = None, anchor_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The whole hook on a compute_logits call: logits (rows, V) of hidden (rows, d); correct(hidden, ids,
    values) -> (rows,) tokens over the rows' top-K (see rows()), given anchor_hidden (R, d) and anchor_ids (R,) too
    when the corrector is anchor-aware. Returns logits, rewritten in place."""
    with torch.profiler.record_function(TOPK):
        ids, values = candidates(logits, k)
    anchor = () if anchor_hidden is None and anchor_ids is None else (anchor_hidden, anchor_ids)
    chosen = correct(hidden, ids, values, *anchor)
    with torch.profiler.record_function(WRITE):
        return hand_back(logits, chosen, point_mass)
