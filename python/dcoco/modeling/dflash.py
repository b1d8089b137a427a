"""A DFlash block drafter (z-lab layout, what vLLM's qwen3_dflash.py serves) and its training loss.

Qwen3-style decoder layers over one block [anchor, MASK x (block_size-1)]. The drafter has no embedding or
LM head of its own: both are the target's, frozen, passed to every call (never in state_dict). Context =
the target's hidden states at target_layer_ids, concatenated, fc + hidden_norm, used as extra keys/values in
every layer. A block attends bidirectionally to itself and to context positions strictly before its anchor;
slot j predicts the token at anchor + j. The config, the layers and the checkpoint files' reading are in
dflash_config.py, dflash_layers.py and weights.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..ops import checks
from .dflash_config import ARCHITECTURE, DFlashConfig, build_target_layer_ids
from .dflash_layers import Layer, RMSNorm, block_mask
from .draft_vocab import TENSORS as DRAFT_HEAD_TENSORS
from .draft_vocab import DraftHead, from_checkpoint
from .weights import check_state, check_storable, read_config, read_tensors

# the names users and tests import from here, wherever they live now
__all__ = ["ARCHITECTURE", "DFlashConfig", "DFlashDrafter", "block_mask", "build_target_layer_ids", "decayed_mean",
           "dflash_loss", "read_config", "read_tensors"]

EmbedOrHead = nn.Module | torch.Tensor  # a module, or its (V,d) weight


class _CausalLM(Protocol):
    """A transformers causal LM, as far as init_from_target reads it (transformers types the decoder as Any)."""
    def get_decoder(self) -> Any: ...


class DFlashDrafter(nn.Module):
    """DFlash drafter. Parameter names are the checkpoint's tensor names (z-lab layout, what vLLM loads):
    layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
    layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.{input,post_attention}_layernorm.weight,
    fc.weight (d, n*d), hidden_norm.weight, norm.weight. No buffers: RoPE is computed per call.
    draft_head: None (draft over the target's whole head, passed to each call), or a DraftHead (draft_vocab.py): a
    shortlisted head the checkpoint carries, written and read with it."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        if not isinstance(config, DFlashConfig):
            raise TypeError(f"config: expected a DFlashConfig, got {type(config).__name__}")
        self.config = c = config
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.grad_checkpoint = False  # training: recompute layer activations in backward (memory for time)
        self.draft_head: DraftHead | None = None
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)  # Qwen3's initializer_range

    @torch.no_grad()
    def init_from_target(self, target: _CausalLM, layer_ids: Sequence[int] | None = None) -> list[str]:
        """Copy decoder layers of a transformers target (Llama / Qwen-style names, the shapes this drafter was
        configured with) into this drafter's layers, and its final norm; layer_ids default to the target's last
        num_hidden_layers. Tensors the target lacks (Qwen3's q/k norms on a Llama target) and fc / hidden_norm
        keep their initialisation. Returns the names copied."""
        layers = target.get_decoder().layers
        ids = list(layer_ids) if layer_ids is not None else list(range(len(layers)))[-len(self.layers):]
        if len(ids) != len(self.layers) or not all(0 <= i < len(layers) for i in ids):
            raise ValueError(f"layer_ids: expected {len(self.layers)} target layers in [0, {len(layers)}), got {ids}")
        copied = []
        pairs = [(f"layers.{k}.", layers[i]) for k, i in enumerate(ids)] + [("norm.", target.get_decoder().norm)]
        mine = dict(self.named_parameters())
        for prefix, src in pairs:
            for name, p in src.named_parameters():
                dst = mine.get(prefix + name)
                if dst is not None and dst.shape == p.shape:
                    dst.copy_(p)
                    copied.append(prefix + name)
        if not copied:
            raise ValueError("target: no decoder tensor matches this drafter's names and shapes")
        return copied

    def target_features(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """(N,S,n*d) from a transformers output_hidden_states tuple (entry 0 = the embeddings): the
        outputs of decoder layers target_layer_ids, concatenated in that order."""
        return torch.cat([hidden_states[i + 1] for i in self.config.target_layer_ids], -1)

    def forward(self, input_ids: torch.Tensor, target_hidden: torch.Tensor, anchors: torch.Tensor,
                embed: EmbedOrHead) -> torch.Tensor:
        """Training: every block of every sequence in one pass. Returns hidden states (N,A,bs,d) after the
        final norm (slot j predicts the token at anchors + j; slot 0's output is unused).

        input_ids (N,S) tokens; target_hidden (N,S,n*d) the target features at every position;
        anchors (N,A) positions in [0,S). Block a is [input_ids[:, anchors[:, a]], MASK x (bs-1)] at
        positions anchors[:, a] + 0..bs-1 and sees target_hidden[:, :anchors[:, a]] and its own block only.
        embed: the target's embedding module or its (V,d) weight."""
        checks.tensor("input_ids", input_ids, 2, "int")
        checks.tensor("anchors", anchors, 2, "int")
        self._check_context(target_hidden, input_ids.shape[0])
        if target_hidden.shape[1] != input_ids.shape[1]:
            raise ValueError(f"target_hidden: expected {input_ids.shape[1]} positions like input_ids, "
                             f"got shape {tuple(target_hidden.shape)}")
        if anchors.shape[0] != input_ids.shape[0] or anchors.shape[1] < 1:
            raise ValueError(f"anchors: expected shape ({input_ids.shape[0]}, A>=1), got {tuple(anchors.shape)}")
        if anchors.numel() and not (0 <= int(anchors.min()) and int(anchors.max()) < input_ids.shape[1]):
            raise ValueError(f"anchors: positions must lie in [0, {input_ids.shape[1]})")
        anchors = anchors.long()
        return self._blocks(input_ids.long().gather(1, anchors), target_hidden, anchors, embed)

    def draft(self, anchor_ids: torch.Tensor, target_hidden: torch.Tensor, embed: EmbedOrHead,
              context_len: torch.Tensor | None = None) -> torch.Tensor:
        """Inference: one block per row. Returns hidden states (N,bs,d) after the final norm.

        anchor_ids (N,) the last committed token; target_hidden (N,C,n*d) the target features of the
        tokens before it (positions 0..C-1); context_len (N,) the real context length per row when rows
        are right-padded (default C): the anchor sits at position context_len."""
        checks.tensor("anchor_ids", anchor_ids, 1, "int")
        V = self.config.vocab_size
        if anchor_ids.numel() and not bool(((anchor_ids >= 0) & (anchor_ids < V)).all()):
            raise ValueError(f"anchor_ids: expected token ids in [0, {V}), got values from {int(anchor_ids.min())} "
                             f"to {int(anchor_ids.max())}")
        N = anchor_ids.shape[0]
        self._check_context(target_hidden, N)
        C = target_hidden.shape[1]
        if context_len is None:
            context_len = torch.full((N,), C, device=anchor_ids.device)
        checks.tensor("context_len", context_len, 1, "int")
        if context_len.shape != (N,) or (N and not (0 <= int(context_len.min()) and int(context_len.max()) <= C)):
            raise ValueError(f"context_len: expected shape ({N},) with values in [0, {C}]")
        return self._blocks(anchor_ids.long()[:, None], target_hidden, context_len.long()[:, None], embed)[:, 0]

    @staticmethod
    def compute_logits(hidden: torch.Tensor, lm_head: EmbedOrHead) -> torch.Tensor:
        """Logits (...,V) through the target's LM head (module, or its (V,d) weight)."""
        if isinstance(lm_head, torch.Tensor):  # contiguous: a strided batch makes matmul expand the (V,d) weight
            if not torch.is_autocast_enabled(hidden.device.type):  # autocast casts both itself: no (V,d) upcast
                lm_head = lm_head.to(hidden.dtype)
            return F.linear(hidden.contiguous(), lm_head)
        if isinstance(lm_head, nn.Module):
            return lm_head(hidden)
        raise TypeError(f"lm_head: expected an nn.Module or a (V,d) weight tensor, got {type(lm_head).__name__}")

    def _check_context(self, target_hidden: torch.Tensor, N: int) -> None:
        checks.tensor("target_hidden", target_hidden, 3, "float")
        n_d = self.fc.in_features
        if target_hidden.shape[0] != N or target_hidden.shape[2] != n_d:
            raise ValueError(f"target_hidden: expected shape ({N}, S, {n_d}) ({len(self.config.target_layer_ids)} "
                             f"target layers x {self.config.hidden_size}), got {tuple(target_hidden.shape)}")

    def _embed(self, ids: torch.Tensor, embed: EmbedOrHead) -> torch.Tensor:
        if isinstance(embed, torch.Tensor):
            if embed.dim() != 2 or embed.shape[1] != self.config.hidden_size:
                raise ValueError(f"embed: expected a (V, {self.config.hidden_size}) weight, got {tuple(embed.shape)}")
            return F.embedding(ids, embed)
        if isinstance(embed, nn.Module):
            return embed(ids)
        raise TypeError(f"embed: expected an nn.Module or a (V,d) weight tensor, got {type(embed).__name__}")

    def _blocks(self, anchor_ids: torch.Tensor, target_hidden: torch.Tensor, anchors: torch.Tensor,
                embed: EmbedOrHead) -> torch.Tensor:
        """anchor_ids, anchors (N,A); target_hidden (N,S,n*d) -> (N,A,bs,d)."""
        c, dt = self.config, self.fc.weight.dtype
        (N, A), S, bs = anchors.shape, target_hidden.shape[1], c.block_size
        ids = torch.full((N, A, bs), c.mask_token_id, dtype=torch.long, device=anchors.device)
        ids[..., 0] = anchor_ids
        x = self._embed(ids, embed).to(dt).reshape(N, A * bs, -1)
        ctx = self.hidden_norm(self.fc(target_hidden.to(dt)))
        block_pos = (anchors[..., None] + torch.arange(bs, device=anchors.device)).reshape(N, A * bs)
        pos = torch.cat([torch.arange(S, device=anchors.device).expand(N, S), block_pos], 1)
        rope = self._rope_tables(pos, dt)
        mask = block_mask(anchors, S, bs)
        remat = self.grad_checkpoint and torch.is_grad_enabled()
        for layer in self.layers:  # with grad_checkpoint, backward recomputes each layer instead of keeping it
            x = checkpoint(layer, x, ctx, rope, mask, use_reentrant=False) if remat else layer(x, ctx, rope, mask)
        return self.norm(x).view(N, A, bs, -1)

    def _rope_tables(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (N,1,L,hd) for positions (N,L), computed in float32 then cast like Qwen3 does."""
        hd = self.config.head_dim
        assert hd is not None  # DFlashConfig.__post_init__ fills it in
        inv_freq = 1.0 / self.config.rope_theta ** (torch.arange(0, hd, 2, device=pos.device).float() / hd)
        ang = pos[..., None].float() * inv_freq
        ang = torch.cat([ang, ang], -1)[:, None]
        return ang.cos().to(dtype), ang.sin().to(dtype)

    # ---- checkpoint IO (z-lab layout: config.json + model.safetensors, no embed_tokens / lm_head) ----

    def save_pretrained(self, path: str | Path, extra_tensors: dict[str, torch.Tensor] | None = None,
                        config_update: dict | None = None, dtype: torch.dtype | None = None) -> None:
        """Write config.json and model.safetensors (tensor names = parameter names, no prefix).
        extra_tensors / config_update: what a layout extending DFlash's adds (names must not collide).
        dtype: the stored floating-point dtype (default: the weights' own)."""
        from safetensors.torch import save_file

        tensors = dict(self.state_dict())
        if self.draft_head is not None:
            extra_tensors = {**(extra_tensors or {}), **self.draft_head.tensors()}
            config_update = {**self.draft_head.config(), **(config_update or {})}
        clash = sorted(tensors.keys() & (extra_tensors or {}).keys())
        if clash:
            raise ValueError(f"extra_tensors: names {clash[:8]} collide with the drafter's")
        tensors.update(extra_tensors or {})
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        cfg = self.config.to_dict()
        dtype = dtype or self.fc.weight.dtype
        check_storable(tensors, dtype)
        cfg["dtype"] = str(dtype).removeprefix("torch.")
        cfg.update(config_update or {})
        (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file({k: v.detach().to(dtype if v.is_floating_point() else v.dtype).contiguous().cpu()
                   for k, v in tensors.items()},
                  str(path / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | None = None, device: torch.device | str = "cpu",
                        architectures: Collection[str] = (ARCHITECTURE,),
                        skip_prefix: str | tuple[str, ...] | None = None) -> DFlashDrafter:
        """Load a DFlash checkpoint directory (model.safetensors or a sharded model.safetensors.index.json).
        dtype defaults to the checkpoint's. ValueError names a wrong architecture/config, missing or
        unexpected tensors, or a tensor of the wrong shape. architectures / skip_prefix: for layouts that
        extend DFlash's (their architecture name; their own tensors, by one prefix or several, left to their
        loader)."""
        path = Path(path)
        raw = read_config(path)
        try:
            config = DFlashConfig.from_dict(raw, architectures)
        except (TypeError, ValueError) as e:  # the field's name alone does not say which checkpoint
            raise ValueError(f"{path / 'config.json'}: {e}") from None
        # rotary inv_freq is derived from the config; transformers may have saved it
        tensors = read_tensors(path, lambda k: not k.endswith("rotary_emb.inv_freq")
                               and not (skip_prefix and k.startswith(skip_prefix)))
        head = from_checkpoint(raw, {k: tensors.pop(k) for k in DRAFT_HEAD_TENSORS if k in tensors}, str(path))
        with torch.device("meta"):
            model = cls(config)
        check_state(tensors, {k: v.shape for k, v in model.state_dict().items()}, str(path),
                    "checkpoint does not match the config", shown=8)
        dtype = dtype or tensors["fc.weight"].dtype
        model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}, assign=True)
        if head is not None:
            model.draft_head = head.to(device=device, dtype=dtype)
        return model


def dflash_loss(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, gamma: float = 7.0) -> torch.Tensor:
    """DFlash's position-decayed cross-entropy, a scalar.

    logits (R,B,V) for the drafted slots k = 1..B of R blocks (B = block_size - 1: slot 0 excluded),
    labels (R,B) the token at anchor + k, valid (R,B) bool. With w_k = exp(-(k-1)/gamma):
        L = sum_{r,k} w_k valid[r,k] CE(logits[r,k], labels[r,k]) / sum_{r,k} w_k valid[r,k]
    (0 with zero gradient when nothing is valid). Computed in float32 at least."""
    checks.tensor("logits", logits, 3, "float")
    checks.tensor("labels", labels, 2, "int")
    checks.tensor("valid", valid, 2, "bool")
    R, B, V = logits.shape
    for name, t in (("labels", labels), ("valid", valid)):
        checks.shape(name, t, (R, B), "to match logits")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not math.isfinite(gamma) or gamma <= 0:
        raise ValueError(f"gamma: expected a finite number > 0, got {gamma!r}")
    lab = torch.where(valid, labels.long(), torch.zeros_like(labels, dtype=torch.long))
    if bool(((lab < 0) | (lab >= V)).any()):
        raise ValueError(f"labels: valid labels must lie in [0, {V})")
    dt = torch.promote_types(logits.dtype, torch.float32)
    ce = F.cross_entropy(logits.to(dt).reshape(R * B, V), lab.reshape(-1), reduction="none").view(R, B)
    return decayed_mean(ce, valid, gamma)


def decayed_mean(ce: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """sum w_k valid ce / sum w_k valid over (R,B) per-slot losses, w_k = exp(-(k-1)/gamma): the reduction of
    dflash_loss, for callers that computed the cross-entropy themselves (training does, in row chunks)."""
    w = torch.exp(-torch.arange(ce.shape[-1], device=ce.device, dtype=ce.dtype) / gamma) * valid
    z = w.sum()
    return (w * ce).sum() / torch.where(z > 0, z, torch.ones_like(z))
