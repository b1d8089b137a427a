"""Path selection on a score grid: prefix-first greedy (what DCOCO serves), Global-Sum, Geometric."""

from __future__ import annotations

import torch

from . import fused, backend, native


def select(scores: torch.Tensor, first_logits: torch.Tensor, rule: str = "greedy", lam: float = 0.75) -> torch.Tensor:
    """Ranks (R,B) int64 of the chosen path through scores (R,B-1,K,K), S_{p+1}(a,b) = scores[:,p,a,b].

    greedy:    k_1 = argmax first_logits, then k_{p+1} = argmax_b S_p(k_p, b).
    global:    argmax over paths of first_logits[k_1] + sum_p S_p(k_p, k_{p+1}) (Viterbi).
    geometric: the same with weight lam^(p-1) on S_p (the paper uses lam = 0.75).
    Ties go to the lower rank (at the earliest slot for the path rules); NaN loses to every number.
    """
    fused.require_tensors(scores=scores, first_logits=first_logits)
    if not isinstance(rule, str):
        raise TypeError(f"rule: expected one of {sorted(fused.RULES)}, got {rule!r}")
    if backend.native(scores.device):
        return native.select(scores, first_logits, rule, float(lam))
    return torch.ops.dcoco.select(scores, first_logits, rule, float(lam))


def sample(scores: torch.Tensor, first_logits: torch.Tensor, temperature: torch.Tensor | float,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled walk: ranks (R,B) int64 drawn slot by slot, k_1 ~ softmax(first_logits / T) and then
    k_{p+1} ~ softmax(S_p(k_p, .) / T), and q (R,B,K) float32, the distribution each rank was drawn from (the
    proposal of speculative sampling, sparse over the K candidates). temperature: a float or (R,) per block;
    T <= 0 is the greedy walk of select(), with q one-hot at its choice.

    One draw per slot is the greedy walk over Gumbel-perturbed scores (Gumbel-max: the argmax of x / T + g over
    independent Gumbel noise g is distributed as softmax(x / T)); the walk reads only the row of the chosen
    predecessor, so perturbing every row independently draws each slot from its own row."""
    fused.require_tensors(scores=scores, first_logits=first_logits)
    if scores.dim() != 4 or first_logits.dim() != 2 or scores.shape[0] != first_logits.shape[0] or \
            scores.shape[2:] != (first_logits.shape[1],) * 2:
        raise ValueError(f"scores (R,B-1,K,K) and first_logits (R,K): got {tuple(scores.shape)} and "
                         f"{tuple(first_logits.shape)}")
    R, K = first_logits.shape
    t = torch.as_tensor(temperature, dtype=torch.float32, device=scores.device).expand(R)
    if t.isnan().any():
        raise ValueError("temperature: expected numbers >= 0, got NaN")
    greedy = (t <= 0)[:, None, None]
    t = torch.where(t > 0, t, 1.0)
    first, grid = first_logits.float() / t[:, None], scores.float() / t[:, None, None, None]

    def gumbel(x: torch.Tensor) -> torch.Tensor:
        e = torch.empty_like(x).exponential_(generator=generator)
        return x - torch.where(greedy.view(R, *[1] * (x.dim() - 1)), 1.0, e).log()  # -log(1) = 0: no noise

    ranks = select(gumbel(grid), gumbel(first), "greedy")
    prev = ranks[:, :-1, None, None].expand(R, grid.shape[1], 1, K)
    q = torch.cat([first[:, None], grid.gather(2, prev)[:, :, 0]], 1).softmax(-1)
    return ranks, torch.where(greedy, torch.nn.functional.one_hot(ranks, K).float(), q)
