"""A DFlash block drafter (z-lab layout, what vLLM's qwen3_dflash.py serves) and its training loss.

Qwen3-style decoder layers over one block [anchor, MASK x (block_size-1)]. The drafter has no embedding or
LM head of its own: both are the target's, frozen, passed to every call (never in state_dict). Context =
the target's hidden states at target_layer_ids, concatenated, fc + hidden_norm, used as extra keys/values in
every layer. A block attends bidirectionally to itself and to context positions strictly before its anchor;
slot j predicts the token at anchor + j.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Collection, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

ARCHITECTURE = "DFlashDraftModel"
EmbedOrHead = nn.Module | torch.Tensor  # a module, or its (V,d) weight


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps when a config gives none: the middle layer, or evenly spaced over 1..T-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclasses.dataclass
class DFlashConfig:
    """Qwen3 sizes plus DFlash's fields; to_dict/from_dict read and write the z-lab config.json."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int | None = None  # only checks target_layer_ids and goes to config.json
    block_size: int = 16
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6  # vLLM's default for DFlash drafts without one
    max_position_embeddings: int = 40960

    def __post_init__(self):
        if self.head_dim is None and isinstance(self.hidden_size, int) and isinstance(self.num_attention_heads, int):
            self.head_dim = self.hidden_size // max(self.num_attention_heads, 1)
        self.target_layer_ids = list(self.target_layer_ids)
        for f in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}: expected an integer >= 1, got {v!r}")
        if not isinstance(self.block_size, int) or self.block_size < 2:
            raise ValueError(f"block_size: expected an integer >= 2, got {self.block_size!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: RoPE needs an even size, got {self.head_dim}")
        if not isinstance(self.mask_token_id, int) or not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id: expected an id in [0, {self.vocab_size}), got {self.mask_token_id!r}")
        top = self.num_target_layers if self.num_target_layers is not None else math.inf
        if not self.target_layer_ids or not all(isinstance(i, int) and 0 <= i < top for i in self.target_layer_ids):
            raise ValueError(f"target_layer_ids: expected a non-empty list of layer indices < {top}, "
                             f"got {self.target_layer_ids!r}")
        for f in ("rms_norm_eps", "rope_theta"):
            if not float(getattr(self, f)) > 0:
                raise ValueError(f"{f}: expected a number > 0, got {getattr(self, f)!r}")

    def to_dict(self) -> dict:
        """config.json content: a qwen3 config plus block_size, num_target_layers and dflash_config."""
        d = {"architectures": [ARCHITECTURE], "model_type": "qwen3",
             **{f: getattr(self, f) for f in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                              "num_attention_heads", "num_key_value_heads", "head_dim",
                                              "vocab_size", "rms_norm_eps", "rope_theta",
                                              "max_position_embeddings", "block_size")},
             # transformers 5 and vLLM read rope_parameters; older readers rope_theta
             "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
             "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
             "layer_types": ["full_attention"] * self.num_hidden_layers,
             "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}}
        if self.num_target_layers is not None:
            d["num_target_layers"] = self.num_target_layers
        return d

    @classmethod
    def from_dict(cls, d: dict, architectures: Collection[str] = (ARCHITECTURE,)) -> DFlashConfig:
        """Parse a DFlash config.json; ValueError on a different architecture or an unsupported variant.
        architectures: the accepted names (a checkpoint that extends the DFlash layout adds its own)."""
        arch = d.get("architectures")
        if not isinstance(arch, list) or not set(arch) & set(architectures):
            raise ValueError(f"architectures: expected one of {sorted(architectures)}, got {arch!r}")
        if d.get("model_type") != "qwen3":
            raise ValueError(f"model_type: expected 'qwen3', got {d.get('model_type')!r}")
        _check_supported(d)
        dc = d.get("dflash_config") or {}

        def pick(key: str):  # some checkpoints put DFlash fields at the top level, not under dflash_config
            return dc[key] if dc.get(key) is not None else d.get(key)

        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "vocab_size") if d.get(k) is None]
        missing += [k for k in ("mask_token_id", "block_size") if pick(k) is None]
        if missing:
            raise ValueError(f"config.json: missing {', '.join(missing)}")
        layers, ntl = d["num_hidden_layers"], d.get("num_target_layers")
        ids = pick("target_layer_ids")
        if ids is None:
            if ntl is None:
                raise ValueError("config.json: missing dflash_config.target_layer_ids (and num_target_layers)")
            ids = build_target_layer_ids(ntl, layers)
        rope = d.get("rope_parameters") or {}
        return cls(hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"], num_hidden_layers=layers,
                   num_attention_heads=d["num_attention_heads"],
                   num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
                   vocab_size=d["vocab_size"], mask_token_id=pick("mask_token_id"), target_layer_ids=ids,
                   num_target_layers=ntl, block_size=pick("block_size"), head_dim=d.get("head_dim"),
                   rms_norm_eps=d.get("rms_norm_eps", 1e-6),
                   rope_theta=d.get("rope_theta") or rope.get("rope_theta") or 1e6,
                   max_position_embeddings=d.get("max_position_embeddings", 40960))


def _check_supported(d: dict) -> None:
    """Refuse config variants this drafter does not implement rather than load them into wrong math."""
    dc = d.get("dflash_config") or {}
    rope_type = (d.get("rope_parameters") or {}).get("rope_type", "default")
    problems = {
        "attention_bias": bool(d.get("attention_bias")),
        "hidden_act": d.get("hidden_act", "silu") != "silu",
        "rope_scaling": bool(d.get("rope_scaling")) or rope_type != "default",
        "layer_types": any(t != "full_attention" for t in d.get("layer_types") or []),
        "use_sliding_window": bool(d.get("use_sliding_window")) or bool(dc.get("use_swa")),
        "dflash_config.causal": bool(dc.get("causal")) or bool(d.get("is_causal")),
        "target_hidden_size": d.get("target_hidden_size") not in (None, d.get("hidden_size")),
        "draft_vocab_size": d.get("draft_vocab_size") not in (None, d.get("vocab_size")),
        "attention_sink_bias": bool(dc.get("attention_sink_bias")) or bool(d.get("add_swa_attention_sink_bias")),
        "input_embedding_scale": d.get("input_embedding_scale", 1.0) != 1.0,
        "output_multiplier": d.get("output_multiplier", 1.0) != 1.0,
        "final_logit_softcapping": d.get("final_logit_softcapping") is not None,
    }
    bad = [k for k, v in problems.items() if v]
    if bad:
        raise ValueError(f"config.json: unsupported DFlash variant ({', '.join(bad)})")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # statistics in float32, as Qwen3 and vLLM do
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style (rotate-half) RoPE; x (N,H,L,hd), cos/sin (N,1,L,hd)."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


class Attention(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.heads, self.kv_heads, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(self.heads * self.hd, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor) -> torch.Tensor:
        """x (N,Q,d) block states, ctx (N,S,d) fused context; keys/values are [ctx ; x], queries x.
        rope: cos/sin (N,1,S+Q,hd) at the key positions (the queries' are the trailing Q)."""
        N, Q, _ = x.shape
        kv_in = torch.cat([ctx, x], 1)
        q = self.q_norm(self.q_proj(x).view(N, Q, self.heads, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_in).view(N, -1, self.kv_heads, self.hd)).transpose(1, 2)
        v = self.v_proj(kv_in).view(N, -1, self.kv_heads, self.hd).transpose(1, 2)
        cos, sin = rope
        q, k = _rope(q, cos[:, :, -Q:], sin[:, :, -Q:]), _rope(k, cos, sin)
        return self.o_proj(_attend(q, k, v, mask).transpose(1, 2).reshape(N, Q, -1))


_FUSED_GQA: bool | None = None  # CUDA: whether a fused SDPA kernel took a masked GQA call (found on first use)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SDPA with GQA (query head i uses kv head i // (heads / kv_heads)) without copying k/v where a kernel reads
    them shared. On CUDA only a fused kernel may take it: torch's math fallback would materialise the attention
    weights (about 11 GiB per layer at Qwen3-8B sizes); where none takes a masked GQA call, k/v are copied per
    query head, which the memory-efficient kernel accepts."""
    global _FUSED_GQA
    g = q.shape[1] // k.shape[1]
    if g == 1 or not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=g > 1)
    if _FUSED_GQA is not False:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            _FUSED_GQA = True
            return out
        except RuntimeError:  # "no available kernel"
            _FUSED_GQA = False
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask)


class MLP(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, ctx, rope, mask):
        # the context enters k/v as is (already hidden_norm-ed), never through this layer's norms or MLP
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def block_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """Boolean attention mask (N,1,A*bs,S+A*bs), True = attend, for blocks at anchors (N,A) over keys
    [context (S) ; blocks (A*bs)]: block a sees context positions < anchors[:,a] and all of its own block.
    No row is empty (a block always sees itself), so padded blocks give finite outputs."""
    N, A = anchors.shape
    pos = torch.arange(context_len, device=anchors.device)
    ctx = (pos < anchors[..., None]).repeat_interleave(block_size, 1)                  # (N,A*bs,S)
    blk = torch.arange(A, device=anchors.device).repeat_interleave(block_size)
    own = (blk[:, None] == blk[None, :]).expand(N, -1, -1)                            # (N,A*bs,A*bs)
    return torch.cat([ctx, own], -1)[:, None]


def _check(name: str, t, ndim: int, floating: bool) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_floating_point() != floating or t.dtype == torch.bool:
        raise TypeError(f"{name}: expected a {'floating' if floating else 'integer'} tensor, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    return t


class DFlashDrafter(nn.Module):
    """DFlash drafter. Parameter names are the checkpoint's tensor names (z-lab layout, what vLLM loads):
    layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
    layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.{input,post_attention}_layernorm.weight,
    fc.weight (d, n*d), hidden_norm.weight, norm.weight. No buffers: RoPE is computed per call."""

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
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)  # Qwen3's initializer_range

    @torch.no_grad()
    def init_from_target(self, target: nn.Module, layer_ids: Sequence[int] | None = None) -> list[str]:
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
        _check("input_ids", input_ids, 2, False)
        _check("anchors", anchors, 2, False)
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
        _check("anchor_ids", anchor_ids, 1, False)
        V = self.config.vocab_size
        if anchor_ids.numel() and not bool(((anchor_ids >= 0) & (anchor_ids < V)).all()):
            raise ValueError(f"anchor_ids: expected token ids in [0, {V}), got values from {int(anchor_ids.min())} "
                             f"to {int(anchor_ids.max())}")
        N = anchor_ids.shape[0]
        self._check_context(target_hidden, N)
        C = target_hidden.shape[1]
        if context_len is None:
            context_len = torch.full((N,), C, device=anchor_ids.device)
        _check("context_len", context_len, 1, False)
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
        _check("target_hidden", target_hidden, 3, True)
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
                        architectures: Collection[str] = (ARCHITECTURE,), skip_prefix: str | None = None
                        ) -> DFlashDrafter:
        """Load a DFlash checkpoint directory (model.safetensors or a sharded model.safetensors.index.json).
        dtype defaults to the checkpoint's. ValueError names a wrong architecture/config, missing or
        unexpected tensors, or a tensor of the wrong shape. architectures / skip_prefix: for layouts that
        extend DFlash's (their architecture name; their own tensors, left to their loader)."""
        path = Path(path)
        config = DFlashConfig.from_dict(read_config(path), architectures)
        # rotary inv_freq is derived from the config; transformers may have saved it
        tensors = read_tensors(path, lambda k: not k.endswith("rotary_emb.inv_freq")
                               and not (skip_prefix and k.startswith(skip_prefix)))
        with torch.device("meta"):
            model = cls(config)
        expected = {k: v.shape for k, v in model.state_dict().items()}
        missing = sorted(expected.keys() - tensors.keys())
        unexpected = sorted(tensors.keys() - expected.keys())
        if missing or unexpected:
            raise ValueError(f"{path}: checkpoint does not match the config: missing {missing[:8]}"
                             f"{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                             f"{' ...' if len(unexpected) > 8 else ''}")
        for k, shape in expected.items():
            if tensors[k].shape != shape:
                raise ValueError(f"{path}: tensor {k} has shape {tuple(tensors[k].shape)}, expected {tuple(shape)}")
        dtype = dtype or tensors["fc.weight"].dtype
        model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}, assign=True)
        return model


def read_json(file: Path) -> dict:
    """A JSON object from file; ValueError naming the file when it is unreadable, not JSON, or not an object."""
    try:
        data = json.loads(Path(file).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: cannot read it as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def read_config(path: str | Path) -> dict:
    """config.json of the checkpoint directory path (read_json's errors; ValueError when it is missing)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"path: no config.json in {path}")
    return read_json(path / "config.json")


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory: model.safetensors, or the shards its index names."""
    path = Path(path)
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    if (path / "model.safetensors.index.json").is_file():
        index = read_json(path / "model.safetensors.index.json").get("weight_map")
        if not isinstance(index, dict):
            raise ValueError(f"{path / 'model.safetensors.index.json'}: expected a weight_map object")
        return [path / f for f in sorted(set(index.values()))]
    raise ValueError(f"path: no model.safetensors (or model.safetensors.index.json) in {path}")


def read_tensors(path: str | Path, keep=lambda name: True) -> dict[str, torch.Tensor]:
    """The tensors named `keep` in a checkpoint directory's safetensors files, checked: a file that safetensors
    cannot read (truncated, corrupt), a tensor stored in a non-floating dtype, or one holding NaN or inf is a
    ValueError naming the file and the tensor. Every weight of both layouts is floating-point."""
    from safetensors import SafetensorError, safe_open

    out = {}
    for f in weight_files(path):
        try:
            with safe_open(str(f), "pt") as st:
                for k in st.keys():
                    if keep(k):
                        out[k] = st.get_tensor(k)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{f}: not a readable safetensors file ({e})") from None
        for k, t in out.items():
            if not t.is_floating_point():
                raise ValueError(f"{f}: tensor {k} is stored as {str(t.dtype).removeprefix('torch.')}; expected a "
                                 "floating-point dtype")
            bad = int((~t.isfinite()).sum())
            if bad:
                raise ValueError(f"{f}: tensor {k} holds {bad} non-finite value(s) (NaN or inf) of {t.numel()}")
    return out


def check_storable(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """ValueError naming the first floating tensor that is not finite, or whose values overflow dtype (float16's
    65504): a checkpoint never stores what it cannot read back as the weights."""
    for k, v in tensors.items():
        if not v.is_floating_point():
            continue
        if not bool(v.isfinite().all()):
            raise ValueError(f"tensor {k} holds non-finite values (NaN or inf); refusing to save it")
        limit = torch.finfo(dtype).max
        big = float(v.detach().abs().max()) if v.numel() else 0.0
        if big > limit:
            raise ValueError(f"tensor {k}: |values| up to {big:.4g} do not fit {str(dtype).removeprefix('torch.')} "
                             f"(at most {limit:.4g}); keep a wider dtype")


def dflash_loss(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, gamma: float = 7.0) -> torch.Tensor:
    """DFlash's position-decayed cross-entropy, a scalar.

    logits (R,B,V) for the drafted slots k = 1..B of R blocks (B = block_size - 1: slot 0 excluded),
    labels (R,B) the token at anchor + k, valid (R,B) bool. With w_k = exp(-(k-1)/gamma):
        L = sum_{r,k} w_k valid[r,k] CE(logits[r,k], labels[r,k]) / sum_{r,k} w_k valid[r,k]
    (0 with zero gradient when nothing is valid). Computed in float32 at least."""
    _check("logits", logits, 3, True)
    _check("labels", labels, 2, False)
    if not isinstance(valid, torch.Tensor) or valid.dtype != torch.bool:
        raise TypeError(f"valid: expected a bool tensor, got {getattr(valid, 'dtype', type(valid).__name__)}")
    R, B, V = logits.shape
    for name, t in (("labels", labels), ("valid", valid)):
        if t.shape != (R, B):
            raise ValueError(f"{name}: expected shape {(R, B)} to match logits, got {tuple(t.shape)}")
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
