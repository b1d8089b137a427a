"""The DCOCO corrector: the paper's exact parameterisation (docs/spec.md, "The corrector"), computed by the backend that
backend.py picks for the inputs' device (the fused compiled core, or the native PyTorch path)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .ops import fused, backend, native


class Corrector(nn.Module):
    """Scores every transition between the top-K candidates of adjacent drafted slots.

    Parameters (names fixed: checkpoints and tools rely on them), with d = hidden_size, r = width:
      cand_proj.weight (r,d), ctx_proj.weight (r,d), fuse_proj.weight (r,2r) on [b ; g],
      fuse_norm.weight / .bias (r), pair_proj.weight (r,2d) on [h_p ; h_{p+1}],
      mlp.0.weight (H,3r+2) / .bias (H) on [s_p ; z_pa ; z_{p+1,b} ; l_p(a) ; l_{p+1}(b)],
      mlp.2.weight (1,H) / .bias (1), zero-initialised so that a fresh corrector keeps the drafter's argmax.
    The token-embedding table is frozen and passed to every call, never a parameter. num_candidates is the
    K the corrector is meant for (checkpoint metadata); no parameter depends on it, and calls accept any
    K up to dcoco.MAX_CANDIDATES.
    """

    def __init__(self, hidden_size: int, num_candidates: int = 16, width: int = 128, mlp_hidden: int = 256):
        super().__init__()
        for name, v, lo in (("hidden_size", hidden_size, 1), ("num_candidates", num_candidates, 1),
                            ("width", width, 2), ("mlp_hidden", mlp_hidden, 1)):
            if not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
        if num_candidates > fused.MAX_CANDIDATES:
            raise ValueError(f"num_candidates: at most {fused.MAX_CANDIDATES} (the compiled maximum), got {num_candidates}")
        d, r, H = hidden_size, width, mlp_hidden
        self.hidden_size, self.num_candidates, self.width, self.mlp_hidden = d, num_candidates, r, H
        self.cand_proj = nn.Linear(d, r, bias=False)
        self.ctx_proj = nn.Linear(d, r, bias=False)
        self.fuse_proj = nn.Linear(2 * r, r, bias=False)
        self.fuse_norm = nn.LayerNorm(r, eps=1e-5)
        self.pair_proj = nn.Linear(2 * d, r, bias=False)
        self.mlp = nn.Sequential(nn.Linear(3 * r + 2, H), nn.GELU(), nn.Linear(H, 1))
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)
        self._prepared: tuple | None = None  # (key, table, float32 weights) from prepare_inference
        self._stand_in: torch.Tensor | None = None  # (V, d) of one element: the embedding of a table-only preparation

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_candidates={self.num_candidates}, width={self.width}, "
                f"mlp_hidden={self.mlp_hidden}")

    def flops(self, B: int, K: int) -> dict[str, int]:
        """Multiply-adds x 2 for one block of B slots and K candidates, without the prepared embedding table:
        "grid" scores all (B-1) K^2 transitions (what L_corr and the path rules use), "greedy" only the chosen
        predecessor's row per slot (the prefix-first walk dcoco serves)."""
        d, r, H = self.hidden_size, self.width, self.mlp_hidden
        fixed = B * K * d * r + B * d * r + B * K * 2 * r * r + (B - 1) * 2 * d * r
        pair = (3 * r + 2) * H + H
        return {"grid": 2 * (fixed + (B - 1) * K * K * pair), "greedy": 2 * (fixed + (B - 1) * K * pair)}

    def weights(self) -> tuple[torch.Tensor, ...]:
        """The ten weight tensors in the order the dcoco ops take them (fused.WEIGHTS)."""
        return (self.cand_proj.weight, self.ctx_proj.weight, self.fuse_proj.weight, self.fuse_norm.weight,
                self.fuse_norm.bias, self.pair_proj.weight, self.mlp[0].weight, self.mlp[0].bias,
                self.mlp[2].weight, self.mlp[2].bias)

    def score(self, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
              embed: torch.Tensor | None = None) -> torch.Tensor:
        """scores[r,p,a,b] = S_{p+1}(a,b): float32 (R,B-1,K,K) for hidden (R,B,d), cand_ids/cand_logits (R,B,K).

        Differentiable in hidden, cand_logits and every parameter (the fused backend's compiled backward, or
        autograd through the native path); embed (frozen) and the ids get no gradient. float64 inputs compute
        in float64 on the CPU (for gradcheck). When nothing needs a gradient, the native path gathers the
        prepared vocabulary table (prepare_inference) instead of projecting the candidates' embedding rows.
        embed None: the table of prepare_inference(embed, table_only=True), no gradient (the native path)."""
        fused.require_tensors(hidden=hidden, cand_ids=cand_ids, cand_logits=cand_logits)
        wanted = torch.is_grad_enabled() and (hidden.requires_grad or cand_logits.requires_grad or
                                              any(p.requires_grad for p in self.parameters()))
        if embed is None:
            if wanted:
                raise ValueError("embed: a gradient is wanted, which the vocabulary table does not carry; pass the "
                                 "embedding table")
            embed = self._table_only()
            _, table, weights = self._prepared
            return native.score(hidden, cand_ids, cand_logits, embed, weights, table)
        fused.require_tensors(embed=embed)
        if backend.native(hidden.device):
            prepared = None if wanted else self._fresh_prepared(embed)
            table, weights = (None, self.weights()) if prepared is None else prepared[1:]
            return native.score(hidden, cand_ids, cand_logits, embed, weights, table)
        return torch.ops.dcoco.score(hidden, cand_ids, cand_logits, embed, *self.weights())

    def forward(self, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
                embed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix-first greedy re-selection (one call of the fused core, or the native walk): (ranks, tokens),
        both int64 (R,B). embed None: the table of prepare_inference(embed, table_only=True)."""
        fused.require_tensors(hidden=hidden, cand_ids=cand_ids, cand_logits=cand_logits)
        if embed is None:
            embed = self._table_only()
        fused.require_tensors(embed=embed)
        prepared = self._fresh_prepared(embed)
        table, weights = (None, self.weights()) if prepared is None else prepared[1:]
        if backend.native(hidden.device):
            return native.correct(hidden, cand_ids, cand_logits, embed, weights, table)
        return torch.ops.dcoco.correct(hidden, cand_ids, cand_logits, embed, *weights, table)

    @torch.no_grad()
    def prepare_inference(self, embed: torch.Tensor, table_only: bool = False) -> torch.Tensor:
        """Inference-only preparation; returns the vocabulary table.

        Tabulates W_fuse[:, :r] LN(W_cand E[v]) for the whole vocabulary (V x r float32: 77.8 MB at
        V=151936, r=128), so forward gathers rows instead of projecting d-wide embeddings, and keeps float32
        copies of the weights (a bf16 module then skips the per-call upcast). Exact: results equal the plain
        formula up to float rounding. Forward drops both (with a warning) when the weights or the embedding
        table change afterwards; call again then. Under torch.compile the check is skipped.

        What the check sees: in-place writes through the tensors themselves (`w.add_(...)`, `copy_`,
        `load_state_dict`) and new tensors. What it cannot see without reading every weight on every call:
        writes that bypass autograd's version counter, i.e. through `w.data` (an EMA written as
        `p.data.mul_(...)`), numpy or DLPack views, and in-place writes to inference tensors
        (torch.inference_mode keeps no counter). After those, call prepare_inference again (or unprepare).

        table_only: the calls that follow pass embed=None and read the table alone, so the caller may free the
        embedding (a gathered copy under tensor parallelism: 1.24 GB at Qwen3-8B against the table's 77.8 MB).
        Nothing then notices the embedding changing: prepare again after it does."""
        if not isinstance(table_only, bool):
            raise TypeError(f"table_only: expected a bool, got {table_only!r}")
        args = (embed, self.cand_proj.weight, self.fuse_proj.weight)
        table = native.cand_table(*args) if backend.native(embed.device) else torch.ops.dcoco.cand_table(*args)
        weights = tuple(w.detach().to(torch.float32).contiguous() for w in self.weights())
        if self._prepared is not None and _same_layout((table, *weights), self._prepared[1:2] + self._prepared[2]):
            # prepared before: refill the same tensors, which a captured CUDA graph keeps reading
            old_table, old_weights = self._prepared[1:]
            for old, new in zip((old_table, *old_weights), (table, *weights)):
                old.copy_(new)
            table, weights = old_table, old_weights
        key = self._key(embed)
        self._stand_in = embed.new_zeros(()).expand(embed.shape) if table_only else None
        self._prepared = ((_TABLE_ONLY, *key[3:]) if table_only else key, table, weights)
        return table

    def unprepare(self) -> None:
        """Drop what prepare_inference kept: forward then computes from the embedding table."""
        self._prepared = self._stand_in = None

    @property
    def prepared(self) -> bool:
        """Whether prepare_inference has run (and not been dropped as stale since)."""
        return self._prepared is not None

    def _key(self, embed: torch.Tensor) -> tuple:
        return (embed.data_ptr(), embed.shape, _version(embed), *((w.data_ptr(), _version(w)) for w in self.weights()))

    def _table_only(self) -> torch.Tensor:
        """The stand-in embedding of a table-only preparation, whose weights must be those it was prepared with."""
        if self._stand_in is None:
            raise ValueError("embed: expected the (V, d) embedding table; None only after "
                             "prepare_inference(embed, table_only=True)")
        if not torch.compiler.is_compiling() and self._key(self._stand_in)[3:] != self._prepared[0][1:]:
            self._prepared = self._stand_in = None
            raise ValueError("embed: the table-only preparation is stale (the weights changed since "
                             "prepare_inference); call prepare_inference(embed, table_only=True) again")
        return self._stand_in

    def _fresh_prepared(self, embed: torch.Tensor) -> tuple | None:
        if self._prepared is None or torch.compiler.is_compiling():
            return self._prepared
        key = self._key(embed)
        if embed is self._stand_in and self._prepared[0][0] is _TABLE_ONLY:
            key = (_TABLE_ONLY, *key[3:])
        if key != self._prepared[0] or self._prepared[1].device != embed.device:
            warnings.warn("dcoco.Corrector: the inference preparation is stale (weights or embed changed since "
                          "prepare_inference); computing from the embedding table instead", stacklevel=3)
            self._prepared = self._stand_in = None
        return self._prepared


def _version(t: torch.Tensor) -> int | None:
    """t's in-place write counter; None for an inference tensor (torch.inference_mode), which keeps none."""
    return None if t.is_inference() else t._version


_TABLE_ONLY = object()  # the embedding part of a table-only preparation's key


def _same_layout(new: tuple, old: tuple) -> bool:
    return len(new) == len(old) and all(a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
                                        for a, b in zip(new, old))
