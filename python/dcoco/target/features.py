"""The target's features for the drafter, computed online: the frozen target runs on every training batch, on each
rank for that rank's own sequences, instead of a feature cache on disk (corpus.py's; at 5 taps x 4096 a cache holds
40 KB per token; SpecForge's online mode does the same). The corpus is then token ids only (TokenCorpus).

The target is frozen and runs under no_grad, so sharding it costs one all-gather per layer and no reduce-scatter:
with shard=True each decoder layer is an FSDP2 `fully_shard` unit (weights 1/world per rank, one layer gathered at
a time). FSDP2 is torch's supported sharding for frozen and trained modules alike, works with gloo on a CPU (tested
there) and leaves the drafter's DDP untouched. Every rank must then run the target equally often: training steps
do; evaluation pads with `idle()`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..logit_chunks import chunk_rows


LABELS = ("argmax", "corpus")


class _LastTap(Exception):
    """Raised by the last tap's hook to end a forward whose later layers nothing reads."""


class TokenCorpus:
    """Sequences as token ids: ids (T,), response (T,) bool (the answer's tokens), offsets (N+1,)."""

    feature_dim = None  # features come from the target, batch by batch

    def __init__(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]):
        if not pairs or not all(len(p) and len(r) for p, r in pairs):
            raise ValueError("pairs: expected a non-empty list of (prompt ids, response ids), both non-empty")
        self.ids = torch.tensor([t for p, r in pairs for t in (*p, *r)], dtype=torch.long)
        self.response = torch.cat([torch.arange(len(p) + len(r)) >= len(p) for p, r in pairs])
        self.offsets = [0, *torch.tensor([len(p) + len(r) for p, r in pairs]).cumsum(0).tolist()]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return {"ids": self.ids[a:b], "response": self.response[a:b]}


class TargetFeatures:
    """The frozen target as the drafter's feature source. Called on right-padded ids (N,S), it returns hidden
    (N,S,F): the outputs of decoder layers layer_ids, concatenated (what output_hidden_states[i + 1] holds), and
    labels (N,S): labels[:, t] = the target's argmax after tokens < t, labels[:, 0] = ids[:, 0]. Right padding
    needs no mask: causal attention keeps pads out of every real position.

    model: a transformers causal LM (its decoder runs; its LM head weight makes the labels). shard: FSDP2 over the
    torchrun group, one unit per decoder layer.
    labels: "argmax" runs the whole target and takes its argmax; "corpus" takes labels = ids, which on the target's
    own greedy answers (`dcoco data generate`) is its argmax at every supervised (response) position, and stops the
    unsharded forward after the last tap: on SmolLM2 (taps up to 27 of 30) that skips 2 layers, the final norm
    and the 49,152-row head (bench/results/online-features/README.md measures both). Prompt positions then hold
    the prompt's own tokens, which no loss reads (anchors and their slots lie in the response).
    teacher: also the target's next-token distribution over its top `teacher` tokens, renormalised (the softmax of
    those logits), for the distillation loss: teacher_ids / teacher_p (N,S,teacher), position t after tokens < t
    as labels are (position 0: ids[:, 0] with probability 1). The forward then runs to the head whatever labels is."""

    def __init__(self, model, layer_ids: Sequence[int], device: torch.device, shard: bool = False,
                 labels: str = "argmax", teacher: int = 0):
        if labels not in LABELS:
            raise ValueError(f"labels: expected one of {LABELS}, got {labels!r}")
        vocab = model.get_output_embeddings().weight.shape[0]
        if isinstance(teacher, bool) or not isinstance(teacher, int) or not 0 <= teacher <= vocab:
            raise ValueError(f"teacher: expected a number of tokens in [0, {vocab}], got {teacher!r}")
        self.labels, self.teacher = labels, teacher
        self.decoder = model.get_decoder()
        layers = self.decoder.layers
        if not layer_ids or max(layer_ids) >= len(layers) - 1 or min(layer_ids) < 0:
            raise ValueError(f"layer_ids: expected taps in [0, {len(layers) - 1}) of a {len(layers)}-layer target "
                             f"(the last layer's output is normed), got {list(layer_ids)}")
        self.layer_ids = list(layer_ids)
        self.feature_dim = len(layer_ids) * model.config.hidden_size
        self.head = model.get_output_embeddings().weight.detach().to(device)  # the decoder's dtype
        self.sharded = shard and dist.is_initialized() and dist.get_world_size() > 1
        self.decoder.requires_grad_(False).eval()
        if self.sharded:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(device.type, (dist.get_world_size(),))
            for layer in layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(self.decoder, mesh=mesh)  # the root: embedding and final norm
        else:
            self.decoder.to(device)
        self.device = device
        self._taps: dict[int, torch.Tensor] = {}
        # a sharded forward runs to the end: every rank must join every layer's all-gather
        self._stop_after = (max(self.layer_ids) if labels == "corpus" and not teacher and not self.sharded
                            else None)
        self._layers = layers

    def _tap(self, i: int, out) -> None:
        self._taps[i] = out[0] if isinstance(out, tuple) else out
        if i == self._stop_after:
            raise _LastTap

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        ids = ids.to(self.device)
        # hooks, not output_hidden_states: only the taps are kept; held for this forward alone, so that other
        # feature sources on the same model (another TargetFeatures, the evaluation) never meet them
        hooks = [self._layers[i].register_forward_hook(lambda mod, args, out, i=i: self._tap(i, out))
                 for i in self.layer_ids]
        try:
            out = self.decoder(input_ids=ids, use_cache=False)
        except _LastTap:  # labels "corpus", unsharded: nothing after the last tap runs
            out = None
        finally:
            for h in hooks:
                h.remove()
        hidden = torch.cat([self._taps.pop(i) for i in self.layer_ids], -1)
        if out is None or (self.labels == "corpus" and not self.teacher):  # nothing read past the taps
            return {"hidden": hidden, "labels": ids}
        last = out.last_hidden_state  # (N,S,d), normed
        x = last[:, :-1].reshape(-1, last.shape[-1])
        step, arg, top = chunk_rows(self.head.shape[0]), [], []
        for i in range(0, len(x), step):
            logits = x[i:i + step] @ self.head.T
            if self.labels == "argmax":
                arg.append(logits.argmax(-1))
            if self.teacher:
                top.append(logits.float().topk(self.teacher, -1))
        N, first = ids.shape[0], ids[:, :1]
        feats = {"hidden": hidden, "labels": ids if self.labels == "corpus" else
                 torch.cat([first, torch.cat(arg).view(N, -1)], 1)}
        if self.teacher:
            n = self.teacher
            p0 = torch.zeros(N, 1, n, device=ids.device)
            p0[..., 0] = 1
            vals, idx = (torch.cat(t).view(N, -1, n) for t in zip(*top))
            feats["teacher_ids"] = torch.cat([first[..., None].expand(N, 1, n), idx], 1)
            feats["teacher_p"] = torch.cat([p0, vals.softmax(-1)], 1)
        return feats

    def idle(self) -> None:
        """Join the sharded forward's collectives without data (a rank with no batch while others run one)."""
        if self.sharded:
            self(torch.zeros(1, 2, dtype=torch.long))
