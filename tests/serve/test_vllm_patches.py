"""dcoco.serve.vllm_patches.wrap without vLLM: a method is wrapped once, and one whose signature is not the one the
wrapper was written for is refused, naming it, and left as it was."""

import pytest

from dcoco.serve import vllm_patches


def _count(calls):
    def make(method):
        def wrapped(self, *args, **kwargs):
            calls.append(args)
            return method(self, *args, **kwargs)
        return wrapped
    return make


def test_a_method_is_wrapped_once_and_still_runs():
    class Proposer:
        def _sample_draft_tokens(self, hidden_states, sampling_metadata, spec_step_idx=0):
            return hidden_states + sampling_metadata

    calls = []
    for _ in range(2):  # every process registers its models once; a second registration keeps the first wrapper
        vllm_patches.wrap(Proposer, "_sample_draft_tokens", ("self", "hidden_states", "sampling_metadata"),
                          _count(calls))
    assert Proposer()._sample_draft_tokens(2, 3) == 5 and calls == [(2, 3)]
    assert getattr(Proposer._sample_draft_tokens, vllm_patches.PATCH_MARK)


def test_a_changed_signature_is_refused_by_name():
    class Proposer:
        def _sample_draft_tokens(self, logits, metadata):
            return logits

    original = Proposer._sample_draft_tokens
    with pytest.raises(RuntimeError, match=r"Proposer\._sample_draft_tokens takes \(self, logits, metadata\), not "
                                           r"\(self, hidden_states, sampling_metadata, \.\.\.\)"):
        vllm_patches.wrap(Proposer, "_sample_draft_tokens", ("self", "hidden_states", "sampling_metadata"),
                          _count([]))
    assert Proposer._sample_draft_tokens is original
