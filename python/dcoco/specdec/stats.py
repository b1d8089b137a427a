"""Confidence intervals for tau and its ratios: paired bootstrap over prompts (scipy.stats.bootstrap), since every
method decodes the same prompts; and Wilson intervals for rates (coverage per slot)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence

import numpy as np

from .engine import Result

LEVEL, RESAMPLES = 0.95, 2000


def _sums(results: Sequence[Result]) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: tokens committed in rounds, rounds. tau = sum(committed) / sum(rounds) over the prompts."""
    return (np.array([sum(r.committed) for r in results], float), np.array([r.rounds for r in results], float))


def _bootstrap(samples: tuple[np.ndarray, ...], statistic, seed: int) -> list[float] | None:
    """The percentile 95% CI of statistic over prompts resampled together (None for fewer than 2 prompts)."""
    from scipy import stats

    if len(samples[0]) < 2:
        return None
    seed_kw = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    res = stats.bootstrap(samples, statistic, paired=True, vectorized=True, axis=-1, n_resamples=RESAMPLES,
                          confidence_level=LEVEL, method="percentile", **{seed_kw: np.random.default_rng(seed)})
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None


def _tau(c, r, axis=-1):
    return c.sum(axis) / np.maximum(r.sum(axis), 1)


def _ratio(c, r, cb, rb, axis=-1):
    return _tau(c, r, axis) / _tau(cb, rb, axis)


def tau_table(per_method: Mapping[str, Sequence[Result]], base: str, seed: int = 0) -> dict[str, dict]:
    """{method: {"tau", "tau_ci", "ratio", "ratio_ci", "prompts"}}: tau with its 95% CI and tau / tau(base) with
    its paired 95% CI (the same resampled prompts for both methods; None for the base itself and for fewer than
    2 prompts). Every method's results must be for the same prompts, in the same order."""
    if base not in per_method:
        raise ValueError(f"base: expected one of {sorted(per_method)}, got {base!r}")
    n = {len(v) for v in per_method.values()}
    if len(n) != 1:
        raise ValueError(f"per_method: every method needs results for the same prompts, got counts {sorted(n)}")
    cb, rb = _sums(per_method[base])
    out = {}
    for name, results in per_method.items():
        c, r = _sums(results)
        tau = float(_tau(c, r)) if r.sum() else None
        row = {"tau": tau, "tau_ci": _bootstrap((c, r), _tau, seed) if tau else None, "prompts": len(c)}
        if tau and rb.sum():
            row["ratio"] = tau / float(_tau(cb, rb))
            row["ratio_ci"] = None if name == base else _bootstrap((c, r, cb, rb), _ratio, seed)
        out[name] = row
    return out


def wilson(hits: int, n: int, level: float = LEVEL) -> tuple[float, float] | None:
    """The Wilson score interval of a rate hits / n (None when n is 0)."""
    from scipy import stats

    if n == 0:
        return None
    ci = stats.binomtest(hits, n).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)
