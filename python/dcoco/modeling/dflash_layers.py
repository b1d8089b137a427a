"""The DFlash drafter's Qwen3-style decoder layer (attention over context and block, MLP, RMSNorm) and its
block attention mask."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .dflash_config import DFlashConfig


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
        assert c.head_dim is not None  # DFlashConfig.__post_init__ fills it in
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
