"""The two vLLM methods the plugin wraps, each once per process and each only when it still has the signature the
wrapper was written for: a vLLM whose method changed shape is refused, naming the method, instead of being wrapped
blindly.

- `Worker.reload_weights`: after vLLM's in-place weight reload (`LLM.collective_rpc("reload_weights")`, sleep
  level 2's wake-up), every live drafter rebuilds its corrector's vocabulary table (follow_reloads).
- `SpecDecodeBaseProposer._sample_draft_tokens`: V1's probabilistic drafts come from the corrector's sampled walk
  (follow_sampling).

Imports vLLM only inside the functions that patch it."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

PATCH_MARK = "dcoco"  # the attribute marking a vLLM method as this plugin's wrapper
LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # this process's drafters, refreshed after a reload


def wrap(owner: type, name: str, params: tuple[str, ...], make: Callable[[Callable], Callable]) -> None:
    """owner.name = make(owner.name), once: a method already wrapped is left alone. params: the parameter names the
    method must start with; otherwise RuntimeError names the method, what it has and what was expected."""
    method = getattr(owner, name)
    if getattr(method, PATCH_MARK, False):
        return
    have = tuple(inspect.signature(method).parameters)
    if have[:len(params)] != params:
        raise RuntimeError(f"dcoco: {owner.__module__}.{owner.__qualname__}.{name} takes ({', '.join(have)}), not "
                           f"({', '.join(params)}, ...) as in the vLLM versions the plugin supports; this vLLM "
                           "cannot serve a dcoco drafter (pip install 'dcoco[vllm]')")
    wrapper = make(method)
    setattr(wrapper, PATCH_MARK, True)
    setattr(owner, name, wrapper)


def follow_reloads() -> None:
    """After vLLM's in-place weight reload, every live drafter (LIVE) refreshes its corrector: the target's
    embedding, shared into the drafter, is reloaded in place, and the table prepared from it would be stale, in
    eager calls and in captured graphs alike."""
    from vllm.v1.worker import gpu_worker

    def make(reload):
        def reload_weights(worker, *args, **kwargs):
            reload(worker, *args, **kwargs)
            for model in list(LIVE):
                model.refresh()
        return reload_weights

    wrap(gpu_worker.Worker, "reload_weights", ("self",), make)


def follow_sampling() -> None:
    """V1's proposer draws probabilistic drafts from the corrector's sampled walk. V1 samples every draft row on its
    own from softmax(logits / T) and caches that softmax as the proposal q, so no logits handed back could give
    both a coherent walk and its q. For a model that walks (`walks`, see DFlashDCOCOForCausalLM.sample_draft),
    under draft_sample_method "probabilistic" with a sampled request in the batch, the proposer takes its tokens
    and q from it instead; other models and greedy batches keep vLLM's own draw."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    def make(draw):
        def _sample_draft_tokens(proposer, hidden_states, sampling_metadata, *args, **kwargs):
            # *args, **kwargs: later vLLMs add a draft-step index (spec_step_idx), 0 for DFlash's one-pass block
            model = proposer.model
            if not getattr(model, "walks", False) or not proposer._enable_probabilistic_draft_probs or \
                    sampling_metadata.all_greedy:
                return draw(proposer, hidden_states, sampling_metadata, *args, **kwargs)
            return model.sample_draft(hidden_states, sampling_metadata.temperature,
                                      lambda logits: proposer._sample_from_logits(logits, sampling_metadata))
        return _sample_draft_tokens

    wrap(SpecDecodeBaseProposer, "_sample_draft_tokens", ("self", "hidden_states", "sampling_metadata"), make)
