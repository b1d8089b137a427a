"""The checks of what a decode is given (the engine's and target-only decoding's arguments): a ValueError naming
the argument and what was expected."""

from __future__ import annotations

import math
from collections.abc import Sequence


def check_sampling(max_new_tokens, temperature, top_p, top_k) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature: expected a finite number >= 0 (0 = greedy), got {temperature!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p: expected a number in (0, 1], got {top_p!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k: expected an integer >= 0 (0 = off), got {top_k!r}")


def check_prompt(prompt_ids, vocab: int) -> None:
    if not isinstance(prompt_ids, Sequence) or isinstance(prompt_ids, (str, bytes)) or not prompt_ids:
        raise ValueError(f"prompt_ids: expected a non-empty list of token ids, got {prompt_ids!r}")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt_ids):
        raise ValueError(f"prompt_ids: expected token ids in [0, {vocab})")
