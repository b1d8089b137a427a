"""The tiny target the engine and simulation tests decode with, and its greedy continuations."""

import pytest

from helpers.tiny_models import PROMPTS, llama

from dcoco.specdec.engine import target_only


@pytest.fixture(scope="module")
def target():
    return llama(64, 0)


@pytest.fixture(scope="module")
def refs(target):
    """Target-only greedy continuation (40 tokens) of each prompt."""
    return [target_only(target, p, 40, eos_token_id=None).tokens for p in PROMPTS]
