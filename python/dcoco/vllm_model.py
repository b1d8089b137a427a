"""The DCOCO drafter inside vLLM: vLLM's own DFlash drafter (`DFlashQwen3ForCausalLM`) plus dcoco's corrector.

vLLM drafts a DFlash block by calling `compute_logits` on the N drafted slots of every request (rows
request-major, (R*N, d)) and taking each row's argmax, or sampling it. Here compute_logits takes the drafter's
top-K per slot, lets the corrector re-select the draft (the checkpoint's selection rule, on the backend dcoco
picks for the device: backend.py) and returns logits that are -inf everywhere but 0 at the chosen token. vLLM's
stock draft step then picks exactly the corrected tokens at any temperature, and its rejection sampler sees a
point-mass proposal (q = 1 at the draft), which keeps verification exact. Imported by vLLM only (the plugin
names it lazily)."""

from __future__ import annotations

import json
from collections.abc import Iterable

import torch
from vllm.logger import init_logger
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM
from vllm.transformers_utils.repo_utils import get_hf_file_bytes

from . import checkpoint
from .corrector import Corrector
from .select import select

logger = init_logger(__name__)


def _dcoco_config(hf_config, model: str, revision) -> dict | None:
    """dcoco_config from the drafter's config (vLLM wraps it; read config.json when the wrapper drops it)."""
    for cfg in (hf_config, getattr(hf_config, "model", None)):
        dc = getattr(cfg, "dcoco_config", None)
        if dc is not None:
            return dict(dc)
    raw = get_hf_file_bytes("config.json", model, revision)
    return json.loads(raw).get("dcoco_config") if raw else None


class DFlashDCOCOForCausalLM(DFlashQwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        spec = vllm_config.speculative_config
        self.num_slots = spec.num_speculative_tokens
        dmc = self.draft_model_config
        dc = _dcoco_config(self.config, dmc.model, dmc.revision)
        self.corrector: Corrector | None = None
        self.selection = "greedy"
        if dc is None:
            logger.warning("dcoco: %s has no dcoco_config; serving it as plain DFlash (corrector off)", dmc.model)
            return
        try:
            dc = checkpoint._dcoco_config(dc, dmc.model)
        except ValueError as e:
            raise ValueError(f"dcoco: bad drafter checkpoint: {e}") from None
        self.selection = dc["selection"]
        # float32 whatever vLLM's dtype: the op upcasts any weight dtype, and bf16 weights would cost accuracy
        self.corrector = Corrector(self.config.hidden_size, dc["num_candidates"], dc["width"],
                                   dc["mlp_hidden"]).float()
        self.corrector.requires_grad_(False)
        logger.info("dcoco: corrector on (K=%d, width=%d, mlp_hidden=%d, selection=%s), %d drafted slots",
                    dc["num_candidates"], dc["width"], dc["mlp_hidden"], self.selection, self.num_slots)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        mine: dict[str, torch.Tensor] = {}

        def drafter_weights():
            for name, w in weights:
                if name.startswith(checkpoint.PREFIX):
                    mine[name.removeprefix(checkpoint.PREFIX)] = w
                else:
                    yield name, w

        out = super().load_weights(drafter_weights())
        if self.corrector is None:
            if mine:
                logger.warning("dcoco: ignoring %d corrector tensors: config.json has no dcoco_config", len(mine))
            return out
        want = self.corrector.state_dict()
        missing, extra = sorted(want.keys() - mine.keys()), sorted(mine.keys() - want.keys())
        bad = [f"{k} {tuple(mine[k].shape)} (expected {tuple(want[k].shape)})" for k in want.keys() & mine.keys()
               if mine[k].shape != want[k].shape]
        if missing or extra or bad:
            raise ValueError(f"dcoco: the drafter checkpoint's corrector tensors do not match its dcoco_config: "
                             f"missing {[checkpoint.PREFIX + k for k in missing]}, unexpected "
                             f"{[checkpoint.PREFIX + k for k in extra]}, wrong shape {bad}")
        self.corrector.load_state_dict({k: v.float() for k, v in mine.items()})
        self.corrector.to(self.model.fc.weight.device)
        return out

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden_states)
        N = self.num_slots
        if self.corrector is None or logits is None or N < 2 or logits.shape[0] % N:
            return logits
        R, V = logits.shape[0] // N, logits.shape[1]
        K = min(self.corrector.num_candidates, V)
        top = logits.view(R, N, V).float().topk(K, dim=-1)             # (R,N,K) sorted: rank 0 = argmax
        hidden = hidden_states.view(R, N, -1)
        embed = self.model.embed_tokens.weight                         # the target's (shared after loading)
        if self.selection == "greedy":
            if not self.corrector.prepared and not (embed.is_cuda and torch.cuda.is_current_stream_capturing()):
                # once, at the first (warm-up) draft: the V x r table makes every later call gather, not project
                self.corrector.prepare_inference(embed)
            tokens = self.corrector(hidden, top.indices, top.values, embed)[1]
        else:
            ranks = select(self.corrector.score(hidden, top.indices, top.values, embed), top.values[:, 0],
                           self.selection)
            tokens = top.indices.gather(2, ranks[..., None])[..., 0]
        out = torch.full_like(logits, float("-inf"))
        return out.scatter_(1, tokens.view(-1, 1).to(torch.long), 0.0)
