"""The DCOCO drafter inside vLLM: vLLM's own DFlash drafter (`DFlashQwen3ForCausalLM`) plus dcoco's corrector.

vLLM drafts a DFlash block from the drafter's hidden states of the N drafted slots of every request (rows
request-major, (R*N, d)) through one of two model calls, and the corrector sits in both:
- `get_top_tokens` (`use_local_argmax_reduction`): vLLM takes tokens. The top-K comes from vLLM's vocab-parallel
  reduction (per-rank top-K, gathered, re-taken), and the corrected tokens are returned.
- `compute_logits` (every other configuration): vLLM takes logits and then an argmax, or a sample. The top-K is
  taken on the logits in their own dtype, and the choice is written into them in place: +inf at the corrected
  token when only an argmax reads them (draft_sample_method "greedy"), or a point mass (0 there, -inf elsewhere)
  when vLLM samples them or caches them as the proposal distribution (V2's "probabilistic", adaptive
  verification). Either way vLLM's rejection sampler sees a point-mass proposal (q = 1 at the draft), which
  keeps verification exact at any temperature.
- V1's probabilistic draft (draft_sample_method "probabilistic", a sampled request in the batch): the proposer's
  draw is replaced by `sample_draft`, the corrector's sampled walk with its proposal q over the K candidates
  (see vllm_patches.follow_sampling), so acceptance is the sum of min(p, q) again.
The corrector runs as the vLLM custom op `dcoco_corrector`: `forward_native` is dcoco's native backend,
`forward_cpu` / `forward_cuda` follow dcoco's backend choice (backend.py), and
`--compilation-config '{"custom_ops": ["-dcoco_corrector"]}'` switches it to forward_native the way vLLM's own ops
are switched. It is on by default, also under inductor (where vLLM's own ops default off): it runs outside the
compiled region, and the backend choice already picks native code where the fused kernel is not proven.

An anchor-aware corrector (dcoco_config.anchor_transition, docs/spec.md) also reads each block's anchor: the
drafter's hidden state at the block's first query position (the last verified token) and that token, both from the
same drafter pass, which forward keeps for the draft call that follows (see forward and _draft_inputs).

Under tensor parallelism (vllm_tp.py) the target's embedding is a vocab-parallel shard on each rank: the full (V, d)
table is gathered once (in chunks), when vLLM shares it into the drafter at load time, the vocabulary table of
`Corrector.prepare_inference` is built from it there, and the gathered copy is freed: each rank keeps only the
(V, r) table (table_only), so eager and graph calls compute the same thing. (A
drafter with its own embedding prepares at its first forward: vLLM's eager start-up pass on a GPU.) Every rank
then corrects the same gathered top-K, so drafts agree across ranks.
A shortlisted draft head (draft_vocab.py: draft_vocab_size, d2t and the drafter's own lm_head) is vLLM's reduced draft
vocabulary: compute_logits hands back the target's vocabulary (-inf off the list), and get_top_tokens' ids are mapped
through d2t, so the corrector always scores target ids.
The tensor work of both hooks (top-K, the corrector call, the hand-back) is in hook.py, which imports no vLLM; the
vLLM methods wrapped are in vllm_patches.py.
Imported by vLLM only (the plugin names it lazily)."""

from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import Iterable

import torch
from vllm.config import get_cached_compilation_config
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.logger import init_logger
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM
from vllm.transformers_utils.repo_utils import get_hf_file_bytes

from ..ops import backend
from ..modeling import checkpoint
from ..modeling.weights import check_state
from . import hook, vllm_patches, vllm_tp
from ..corrector import Corrector

logger = init_logger(__name__)

OP_NAME = "dcoco_corrector"
HOOK = "dcoco_hook"  # profiler region: everything the plugin adds to a draft call (top-K, corrector, write)


def _dcoco_config(hf_config, model: str, revision) -> dict | None:
    """dcoco_config from the drafter's config (vLLM wraps it; read config.json when the wrapper drops it)."""
    for cfg in (hf_config, getattr(hf_config, "model", None)):
        dc = getattr(cfg, "dcoco_config", None)
        if dc is not None:
            return dict(dc)
    raw = get_hf_file_bytes("config.json", model, revision)
    return json.loads(raw).get("dcoco_config") if raw else None


@CustomOp.register(OP_NAME)
class CorrectorOp(CustomOp):
    """tokens (R,N) int64 = the corrected draft for hidden (R,N,d), cand_ids / cand_logits (R,N,K) (rank 0 = the
    drafter's argmax), by the checkpoint's selection rule. It owns no parameters: the model keeps the corrector."""

    def __init__(self, corrector: Corrector, selection: str):
        # On unless "-dcoco_corrector": vLLM turns custom ops off by default under inductor so that the compiler
        # sees native code, but the corrector runs outside vLLM's compiled region, and forward_cpu/forward_cuda
        # already pick the native backend wherever the fused kernel is not proven.
        super().__init__(enforce_enable=f"-{OP_NAME}" not in get_cached_compilation_config().custom_ops)
        self.selection = selection
        self._corrector = [corrector]  # a plain reference, so the corrector's weights stay the model's
        # the full (V, d) target embedding (a view of the shared one), set by the model once loaded; None under TP,
        # where the corrector keeps only its vocabulary table (a table-only preparation)
        self.embed: torch.Tensor | None = None

    def forward_native(self, hidden, cand_ids, cand_logits, anchor_ids=None):
        with backend.use_backend("native"):
            return self._tokens(hidden, cand_ids, cand_logits, anchor_ids)

    def forward_cpu(self, hidden, cand_ids, cand_logits, anchor_ids=None):
        return self._tokens(hidden, cand_ids, cand_logits, anchor_ids)

    def forward_cuda(self, hidden, cand_ids, cand_logits, anchor_ids=None):
        return self._tokens(hidden, cand_ids, cand_logits, anchor_ids)

    def _tokens(self, hidden, cand_ids, cand_logits, anchor_ids):
        return hook.tokens(self._corrector[0], self.embed, self.selection, hidden, cand_ids, cand_logits, anchor_ids)

    def sampled(self, hidden, cand_ids, cand_logits, temperature, anchor_ids=None):
        """hook.sampled on the backend this op runs (forward_native: the native one)."""
        native = self._forward_method.__func__ is CorrectorOp.forward_native
        with backend.use_backend("native") if native else contextlib.nullcontext():
            return hook.sampled(self._corrector[0], self.embed, hidden, cand_ids, cand_logits, temperature,
                                anchor_ids)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class DFlashDCOCOForCausalLM(DFlashQwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        spec = vllm_config.speculative_config
        self.num_slots = spec.num_speculative_tokens
        # dynamic speculation (num_speculative_tokens_per_batch_size): V1's proposer drafts a different number of
        # slots per step, which only the step's attention metadata tells the model (see _draft_block)
        self.dynamic = bool(spec.uses_dynamic_speculative_decoding())
        self._block: tuple[int, int] | None = None  # (requests, slots) of the running draft pass, when dynamic
        # (hidden, input_ids) of the running draft pass, for an anchor-aware corrector (see forward)
        self._anchors: tuple[torch.Tensor, torch.Tensor] | None = None
        dmc = self.draft_model_config
        if self.draft_id_to_target_id is not None:
            # a shortlisted draft head (dcoco export --draft-vocab): its own (N, d) lm_head, which V1's proposer
            # replaces with the target's whole head unless the model says it has its own
            self.has_own_lm_head = True
        dc = _dcoco_config(self.config, dmc.model, dmc.revision)
        self.corrector: Corrector | None = None
        self.walks = False
        self._ready = False  # the corrector's table prepared from the target's embedding
        if dc is None:
            logger.warning("dcoco: %s has no dcoco_config; serving it as plain DFlash (corrector off)", dmc.model)
            return
        try:
            dc = checkpoint.dcoco_config(dc, dmc.model)
        except ValueError as e:
            raise ValueError(f"dcoco: bad drafter checkpoint: {e}") from None
        if self.num_slots < 2:
            logger.warning("dcoco: num_speculative_tokens=%d: the corrector keeps slot 1's argmax, so it changes "
                           "nothing; draft 2 or more tokens to use it", self.num_slots)
        # a proposal distribution is read from the draft logits (sampled drafts, adaptive verification's estimator)
        self.point_mass = spec.draft_sample_method == "probabilistic" or bool(
            getattr(spec, "enable_adaptive_verification", False))
        # V1 under probabilistic drafts: the sampled walk and its proposal instead (sample_draft,
        # vllm_patches.follow_sampling)
        self.walks = spec.draft_sample_method == "probabilistic" and dc["selection"] == "greedy"
        # float32 whatever vLLM's dtype: the op upcasts any weight dtype, and bf16 weights would cost accuracy
        self.corrector = Corrector(self.config.hidden_size, dc["num_candidates"], dc["width"], dc["mlp_hidden"],
                                   dc["anchor_transition"]).float()
        self.corrector.requires_grad_(False)
        self.corrector_op = CorrectorOp(self.corrector, dc["selection"])
        self._watch_embedding()
        vllm_patches.LIVE.add(self)
        vllm_patches.follow_reloads()
        if self.walks:
            vllm_patches.follow_sampling()
        logger.info("dcoco: corrector on (K=%d, width=%d, mlp_hidden=%d, selection=%s, anchor_transition=%s), %d "
                    "drafted slots, custom op %s runs %s", dc["num_candidates"], dc["width"], dc["mlp_hidden"],
                    dc["selection"], dc["anchor_transition"],
                    self.num_slots, OP_NAME, self.corrector_op._forward_method.__name__)

    @property
    def _corrector_on(self) -> Corrector:  # on the paths past the None checks of prepare, refresh and _slots
        assert self.corrector is not None, "dcoco: a corrector path ran with the corrector off"
        return self.corrector

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
        check_state(mine, {k: v.shape for k, v in self.corrector.state_dict().items()}, "dcoco",
                    "the drafter checkpoint's corrector tensors do not match its dcoco_config", checkpoint.PREFIX)
        self.corrector.load_state_dict({k: v.float() for k, v in mine.items()})
        self.corrector.to(self.model.fc.weight.device)
        return out

    # --- start-up: the target's embedding (shared into the drafter by vLLM after load_weights) --------------

    def _watch_embedding(self) -> None:
        """Prepare when vLLM shares the target's embedding into the drafter (right after load_weights, on every
        rank at once): a module-registration hook, removed once it has fired or at the first forward."""
        me = weakref.ref(self)  # the hook is global: it must not keep the model alive

        def on_register(module, name, sub):
            owner = me()
            if owner is None:
                handle.remove()
            elif module is owner.model and name == "embed_tokens":
                owner.prepare(sub)
        handle = torch.nn.modules.module.register_module_module_registration_hook(on_register)
        self._watch = handle

    def prepare(self, emb=None) -> None:
        """Once, eagerly, before any graph: the corrector's vocabulary table from the full embedding. emb: the
        embedding module being shared in (default: the drafter's own, when vLLM shared none)."""
        if self.corrector is None or (emb is None and self._ready):
            return
        self._watch.remove()
        if _capturing():
            raise RuntimeError("dcoco: the corrector was first called inside CUDA graph capture; vLLM's eager "
                               "start-up pass should have prepared it (report this with your vLLM version)")
        self._prepare_from(self.model.embed_tokens if emb is None else emb)

    def _prepare_from(self, emb) -> None:
        """The table (refilled in place when there was one: captured graphs read it). On one rank the corrector
        keeps the shared embedding, a view; under TP only the table, and the gathered copy is freed on return."""
        embed = vllm_tp.full_embedding(emb)
        gathered = emb.tp_size > 1
        self._corrector_on.prepare_inference(embed, table_only=gathered)
        self.corrector_op.embed = None if gathered else embed
        self._ready = True

    def refresh(self) -> None:
        """Rebuild the corrector's vocabulary table from the current embedding, in place (the tensors captured CUDA
        graphs read), after the weights changed: vLLM's in-place reload calls it (vllm_patches.follow_reloads)."""
        if self.corrector is not None and self._ready:
            self._prepare_from(self.model.embed_tokens)
            logger.info("dcoco: the corrector's vocabulary table was rebuilt after a weight reload")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None):
        self.prepare()
        if self.dynamic:
            self._block = self._draft_block()
        hidden = super().forward(input_ids, positions, inputs_embeds)
        if self.corrector is not None and self.corrector.anchor_transition:
            # Both runners query 1 + N rows per request, request-major, the anchor (the last verified token) first,
            # and hand only the N drafted rows to the draft call that follows: keep the whole pass (references,
            # no copy) so that call can take each block's first row (see _draft_inputs). Inside V2's captured
            # graph these are the graph's own tensors, so replays pair them the same way.
            self._anchors = (hidden, input_ids)
        return hidden

    def _draft_block(self) -> tuple[int, int] | None:
        """(requests, slots) of this draft pass from its attention metadata: DFlash queries 1 + N tokens per request
        (the anchor, then N mask slots), so max_query_len = 1 + N and num_actual_tokens = R (1 + N). None in vLLM's
        dummy and profile runs, which have no metadata."""
        md = get_forward_context().attn_metadata if is_forward_context_available() else None
        md = md.get(self.model.layers[0].self_attn.attn.layer_name) if isinstance(md, dict) else None
        q, t = getattr(md, "max_query_len", None), getattr(md, "num_actual_tokens", None)
        if not q or not t or t % q:
            return None
        return t // q, q - 1

    def precompute_and_store_context_kv(self, *args, **kwargs):
        self.prepare()
        return super().precompute_and_store_context_kv(*args, **kwargs)

    # --- the two draft calls -----------------------------------------------------------------------------

    def _slots(self, rows: int) -> int | None:
        """Slots N per request in a (R*N)-row draft call, or None when the corrector does not apply (off; one slot;
        a dummy shape). Under dynamic speculation N is the running pass's (read once: a later call without a
        forward, as in a replayed graph, cannot reuse it), else num_speculative_tokens."""
        if self.corrector is None:
            return None
        N, block = self.num_slots, self._block
        if self.dynamic:
            self._block = None
            if block is not None:
                if rows != block[0] * block[1]:
                    logger.warning_once("dcoco: a draft call with %d rows in a pass of %d requests x %d slots; the "
                                        "corrector is off for such calls", rows, *block)
                    return None
                N = block[1]
        if N < 2 or rows % N:
            return None
        self.prepare()
        return N

    def _draft_inputs(self, rows: int) -> tuple[int, tuple] | None:
        """(slots, anchor) for a draft call of `rows` rows, or None when the corrector does not apply (see _slots).
        anchor: () for the paper's corrector; for an anchor-aware one, (anchor_hidden (R, d), anchor_ids (R,)): each
        request's first query row of the pass forward kept, strided views (no copy, no host sync). Read once: a
        later call without a forward (a probe, V1's breakable graph replay) finds none, and then serves plain
        DFlash drafts rather than pair drafted rows with another pass's anchors."""
        anchors, self._anchors = self._anchors, None
        slots = self._slots(rows)
        if slots is None or not self._corrector_on.anchor_transition:
            return None if slots is None else (slots, ())
        R, Q = rows // slots, slots + 1
        if anchors is None or anchors[0].shape[0] < R * Q:
            logger.warning_once("dcoco: a draft call of %d rows without the drafter pass that made them (its anchors "
                                "are needed by the anchor-aware corrector); such calls draft as plain DFlash", rows)
            return None
        hidden, ids = anchors
        return slots, (hidden[:R * Q:Q], ids[:R * Q:Q])

    def correct(self, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor, slots: int,
                anchor: tuple = ()) -> torch.Tensor:
        """(R*N,) corrected tokens from the (R*N, d) hidden rows and their (R*N, K) top-K (rank 0 = argmax),
        N = slots; anchor: (), or (anchor_hidden (R, d), anchor_ids (R,)) for an anchor-aware corrector."""
        with torch.profiler.record_function(OP_NAME):  # the corrector's share of a draft step, in a profile
            return hook.rows(self.corrector_op, slots)(hidden, cand_ids, cand_logits, *anchor)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden_states)
        block = None if logits is None else self._draft_inputs(logits.shape[0])
        if block is None:
            return logits
        slots, anchor = block
        with torch.profiler.record_function(HOOK):
            return hook.on_logits(lambda h, i, v: self.correct(h, i, v, slots, anchor), hidden_states, logits,
                                  self._corrector_on.num_candidates, self.point_mass)

    def sample_draft(self, hidden_states: torch.Tensor, temperature: torch.Tensor, plain):
        """V1's probabilistic draft (vllm_patches.follow_sampling): tokens (rows,) drawn by the corrector's sampled
        walk at each request's temperature (R,) (below vLLM's 1e-5: greedy), and their proposal (rows, V) float32,
        zero off each slot's K candidates. plain(logits) -> (tokens, probs) is vLLM's own draw, used when the
        corrector does not apply to the call (dynamic speculation's odd calls, dummy shapes)."""
        logits = super().compute_logits(hidden_states)
        block = None if logits is None else self._draft_inputs(logits.shape[0])
        if block is None:
            return plain(logits)
        slots, anchor = block
        anchor_hidden, anchor_ids = anchor or (None, None)
        with torch.profiler.record_function(HOOK):
            ids, values = hook.candidates(logits, self._corrector_on.num_candidates)
            R, K = ids.shape[0] // slots, ids.shape[1]
            t = torch.where(temperature < 1e-5, 0.0, temperature.float())
            with torch.profiler.record_function(OP_NAME):
                tokens, q = self.corrector_op.sampled(hook.blocks(hidden_states, slots, anchor_hidden),
                                                      ids.view(R, slots, K), values.view(R, slots, K), t, anchor_ids)
            return tokens.reshape(-1), hook.proposal(ids, q.reshape(-1, K), logits.shape[-1])

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        block = self._draft_inputs(hidden_states.shape[0])
        if block is None:
            return self._target_ids(super().get_top_tokens(hidden_states))
        with torch.profiler.record_function(HOOK):  # includes the LM head here: vLLM's reduction runs it
            k = min(self._corrector_on.num_candidates, self.lm_head.org_vocab_size)
            ids, values = vllm_tp.top_k(self.logits_processor, self.lm_head, hidden_states, k)
            return self.correct(hidden_states, self._target_ids(ids), values, *block)

    def _target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids of the LM head's ids: the same, or through d2t for a shortlisted head (sorted by target id, so
        the order among ids, and argmax_first's tie rule, carry over)."""
        d2t = self.draft_id_to_target_id
        return ids if d2t is None else ids + d2t[ids]
