"""The tiny random Llama target the training tests run on (dcoco.testing.tiny: vocab 100, hidden 64), saved once per
module, loaded, and its corpus cached (short answers, the drafter's taps)."""

from __future__ import annotations

from pathlib import Path

import pytest

SETTINGS_KW = {"max_new_tokens": 24, "gen_batch": 4, "feat_batch": 4}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    """A saved tiny Llama + word-level tokenizer with a chat template, and a prompts file."""
    from dcoco.testing import tiny

    return tiny.save_target(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def target(target_dir):
    pytest.importorskip("transformers", reason="training needs the demo extra (pip install '.[demo]')")
    from dcoco.train import recipe

    return recipe.load_target(str(target_dir))


@pytest.fixture(scope="module")
def corpus(target, target_dir, tmp_path_factory):
    from dcoco.target import corpus as corpus_mod
    from dcoco.testing import tiny

    tok, model = target
    ids = corpus_mod.encode_prompts(tok, corpus_mod.load_prompts(target_dir / "prompts.jsonl"))
    settings = corpus_mod.CorpusSettings(tiny.TAPS, **SETTINGS_KW)
    return corpus_mod.build_corpus(model, ids, tmp_path_factory.mktemp("cache"), settings, progress=False)
