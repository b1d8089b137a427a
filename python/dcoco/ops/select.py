"""Path selection on a score grid: prefix-first greedy (what DCOCO serves), Global-Sum, Geometric."""

from __future__ import annotations

import math
import numbers

import torch

from . import backend, checks, fused, native


def select(scores: torch.Tensor, first_logits: torch.Tensor, rule: str = "greedy", lam: float = 0.75) -> torch.Tensor:
    """Ranks (R,B) int64 of the chosen path through scores (R,B-1,K,K), S_{p+1}(a,b) = scores[:,p,a,b].

    greedy:    k_1 = argmax first_logits, then k_{p+1} = argmax_b S_p(k_p, b).
    global:    argmax over paths of first_logits[k_1] + sum_p S_p(k_p, k_{p+1}) (Viterbi).
    geometric: the same with weight lam^(p-1) on S_p (the paper uses lam = 0.75); lam^(B-2) within [2^-64, 2^64],
               where float32 path sums keep the scores (checks.geometric_lam).
    Ties go to the lower rank (at the earliest slot for the path rules); NaN loses to every number.
    """
    fused.require_tensors(scores=scores, first_logits=first_logits)
    if not isinstance(rule, str):
        raise TypeError(f"rule: expected one of {sorted(fused.RULES)}, got {rule!r}")
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real):
        raise TypeError(f"lam: expected a number, got {lam!r}")
    if backend.native(scores.device):
        return native.select(scores, first_logits, rule, float(lam))
    return torch.ops.dcoco.select(scores, first_logits, rule, float(lam))


TEMPERATURE_FLOOR = 1e-5  # below it the sampled walk is the greedy one (as in vLLM's sampler): x / T overflows


def sample(scores: torch.Tensor, first_logits: torch.Tensor, temperature: torch.Tensor | float,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled walk: ranks (R,B) int64 drawn slot by slot, k_1 ~ softmax(first_logits / T) and then
    k_{p+1} ~ softmax(S_p(k_p, .) / T), and q (R,B,K) float32, the distribution each rank was drawn from (the
    proposal of speculative sampling, sparse over the K candidates). temperature: a number or an (R,) float
    tensor, one per block; T < TEMPERATURE_FLOOR (1e-5, zero and negatives too) is the greedy walk of select(),
    with q one-hot at its choice.

    Non-finite scores: a NaN or -inf candidate is never drawn and has q = 0, unless its whole row is so (then
    the draw is select()'s, rank 0, with q one-hot at it). A +inf candidate is a point mass: the row draws its
    lowest-ranked +inf, with q one-hot at it. q is thus finite and sums to 1 over the candidates it can draw.

    One draw per slot is the greedy walk over Gumbel-perturbed scores (Gumbel-max: the argmax of x / T + g over
    independent Gumbel noise g is distributed as softmax(x / T)); the walk reads only the row of the chosen
    predecessor, so perturbing every row independently draws each slot from its own row."""
    checks.float_tensor("scores", scores, 4)
    checks.float_tensor("first_logits", first_logits, 2)
    if scores.shape[0] != first_logits.shape[0] or scores.shape[2:] != (first_logits.shape[1],) * 2:
        raise ValueError(f"scores (R,B-1,K,K) and first_logits (R,K): got {tuple(scores.shape)} and "
                         f"{tuple(first_logits.shape)}")
    R, K = first_logits.shape
    t = _temperatures(temperature, R, scores.device)
    greedy = (t < TEMPERATURE_FLOOR)[:, None, None]
    t = torch.where(greedy[:, 0, 0], 1.0, t)

    def scaled(x: torch.Tensor) -> torch.Tensor:  # x / T, NaN as -inf: never drawn
        x = x.float() / t.view(R, *[1] * (x.dim() - 1))
        return x.masked_fill(x.isnan(), -math.inf)

    def gumbel(x: torch.Tensor) -> torch.Tensor:
        e = torch.empty_like(x).exponential_(generator=generator)
        return x - torch.where(greedy.view(R, *[1] * (x.dim() - 1)), 1.0, e).log()  # -log(1) = 0: no noise

    first, grid = scaled(first_logits), scaled(scores)
    ranks = select(gumbel(grid), gumbel(first), "greedy")
    prev = ranks[:, :-1, None, None].expand(R, grid.shape[1], 1, K)
    q = torch.cat([first[:, None], grid.gather(2, prev)[:, :, 0]], 1).softmax(-1)
    point = greedy | ~q.isfinite().all(-1, keepdim=True)  # a row all -inf (NaN), or holding +inf
    return ranks, torch.where(point, torch.nn.functional.one_hot(ranks, K).float(), q)


def _temperatures(temperature, R: int, device: torch.device) -> torch.Tensor:
    """(R,) float32 temperatures from a number or a () / (R,) floating tensor (TypeError / ValueError naming
    temperature otherwise, NaN included)."""
    if isinstance(temperature, torch.Tensor):
        if not temperature.is_floating_point():
            raise TypeError(f"temperature: expected a floating-point tensor, got {temperature.dtype}")
        if temperature.shape not in ((), (R,)):
            raise ValueError(f"temperature: expected a number or a ({R},) tensor, one per block, got shape "
                             f"{tuple(temperature.shape)}")
    elif isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature: expected a number or a ({R},) tensor, got {temperature!r}")
    t = torch.as_tensor(temperature, dtype=torch.float32, device=device).expand(R)
    if t.isnan().any():
        raise ValueError("temperature: expected numbers >= 0, got NaN")
    return t
