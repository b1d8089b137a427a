"""The DCOCO corrector: the paper's exact parameterisation (docs/spec.md, "The corrector"), computed by the backend that
backend.py picks for the inputs' device (the fused compiled core, or the native PyTorch path)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from .ops import checks, fused, backend, native


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

    anchor_transition (off by default: the paper's DCOCO): the extension of docs/spec.md ("Anchor transition"),
    with the same parameters. The anchor (the block's first input, the last verified token t_0) is a slot 0 whose
    one candidate is t_0 with logit 0 and whose hidden state is the drafter's at that position, so slot 1 is
    re-ranked too: S_0(b) = l_1(b) + Delta(0, b). Every call then takes hidden (R,B+1,d), position 0 the anchor's,
    and anchor_ids (R,); cand_ids / cand_logits stay (R,B,K). Inside, slot 0 carries K copies of the anchor (one
    grid shape for every slot), so the compiled core and the native path run unchanged over B+1 slots: the
    greedy walk starts at slot 0's rank 0 (its logits are all 0) and its grid rows are all S_0.
    """

    def __init__(self, hidden_size: int, num_candidates: int = 16, width: int = 128, mlp_hidden: int = 256,
                 anchor_transition: bool = False):
        super().__init__()
        for name, v, lo in (("hidden_size", hidden_size, 1), ("num_candidates", num_candidates, 1),
                            ("width", width, 2), ("mlp_hidden", mlp_hidden, 1)):
            if not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
        if not isinstance(anchor_transition, bool):
            raise TypeError(f"anchor_transition: expected a bool, got {anchor_transition!r}")
        self.anchor_transition = anchor_transition
        if num_candidates > fused.MAX_CANDIDATES:
            raise ValueError(f"num_candidates: at most {fused.MAX_CANDIDATES} (the compiled maximum), "
                             f"got {num_candidates}")
        d, r, H = hidden_size, width, mlp_hidden
        self.hidden_size, self.num_candidates, self.width, self.mlp_hidden = d, num_candidates, r, H
        self.cand_proj = nn.Linear(d, r, bias=False)
        self.ctx_proj = nn.Linear(d, r, bias=False)
        self.fuse_proj = nn.Linear(2 * r, r, bias=False)
        self.fuse_norm = nn.LayerNorm(r, eps=1e-5)
        self.pair_proj = nn.Linear(2 * d, r, bias=False)
        self.mlp = nn.Sequential(nn.Linear(3 * r + 2, H), nn.GELU(), nn.Linear(H, 1))
        out = cast(nn.Linear, self.mlp[2])
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)
        self._prepared: Prepared | None = None  # what prepare_inference made
        self._stand_in: torch.Tensor | None = None  # (V, d) of one element: the embedding of a table-only preparation

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_candidates={self.num_candidates}, width={self.width}, "
                f"mlp_hidden={self.mlp_hidden}" + (", anchor_transition=True" if self.anchor_transition else ""))

    def flops(self, B: int, K: int) -> dict[str, int]:
        """Multiply-adds x 2 for one block of B drafted slots and K candidates, without the prepared embedding
        table: "grid" scores all (B-1) K^2 transitions (what L_corr and the path rules use), "greedy" only the
        chosen predecessor's row per slot (the prefix-first walk dcoco serves). With the anchor transition, what
        is computed: B+1 slots, slot 0's K candidates all the anchor."""
        d, r, H = self.hidden_size, self.width, self.mlp_hidden
        B += self.anchor_transition
        fixed = B * K * d * r + B * d * r + B * K * 2 * r * r + (B - 1) * 2 * d * r
        pair = (3 * r + 2) * H + H
        return {"grid": 2 * (fixed + (B - 1) * K * K * pair), "greedy": 2 * (fixed + (B - 1) * K * pair)}

    def weights(self) -> tuple[torch.Tensor, ...]:
        """The ten weight tensors in the order the dcoco ops take them (fused.WEIGHTS)."""
        hid, out = cast(nn.Linear, self.mlp[0]), cast(nn.Linear, self.mlp[2])
        return (self.cand_proj.weight, self.ctx_proj.weight, self.fuse_proj.weight, self.fuse_norm.weight,
                self.fuse_norm.bias, self.pair_proj.weight, hid.weight, hid.bias, out.weight, out.bias)

    def score(self, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
              embed: torch.Tensor | None = None, anchor_ids: torch.Tensor | None = None) -> torch.Tensor:
        """scores[r,p,a,b] = S_{p+1}(a,b): float32 (R,B-1,K,K) for hidden (R,B,d), cand_ids/cand_logits (R,B,K).
        With the anchor transition: (R,B,K,K) for hidden (R,B+1,d) and anchor_ids (R,), scores[:, 0, a, b] =
        S_0(b) for every a and scores[:, p] = S_p for p >= 1; walk_inputs splits them for select and the loss.

        Differentiable in hidden, cand_logits and every parameter (the fused backend's compiled backward, or
        autograd through the native path); embed (frozen) and the ids get no gradient. float64 inputs compute
        in float64 on the CPU (for gradcheck). When nothing needs a gradient, the native path gathers the
        prepared vocabulary table (prepare_inference) instead of projecting the candidates' embedding rows.
        embed None: the table of prepare_inference(embed, table_only=True), no gradient (the native path)."""
        fused.require_tensors(hidden=hidden, cand_ids=cand_ids, cand_logits=cand_logits)
        hidden, cand_ids, cand_logits = self._slots(hidden, cand_ids, cand_logits, anchor_ids, embed)
        wanted = torch.is_grad_enabled() and (hidden.requires_grad or cand_logits.requires_grad or
                                              any(p.requires_grad for p in self.parameters()))
        if embed is None:
            if wanted:
                raise ValueError("embed: None reads the vocabulary table, which carries no gradient; score under "
                                 "torch.no_grad() (or pass the embedding table for a gradient)")
            embed = self._table_only()
            assert self._prepared is not None  # _table_only returned: the table-only preparation is there
            return native.score(hidden, cand_ids, cand_logits, embed, self._prepared.weights, self._prepared.table)
        fused.require_tensors(embed=embed)
        if backend.native(hidden.device):
            prepared = None if wanted else self._fresh_prepared(embed)
            table, weights = (None, self.weights()) if prepared is None else (prepared.table, prepared.weights)
            return native.score(hidden, cand_ids, cand_logits, embed, weights, table)
        return torch.ops.dcoco.score(hidden, cand_ids, cand_logits, embed, *self.weights())

    def forward(self, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
                embed: torch.Tensor | None = None, anchor_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix-first greedy re-selection (one call of the fused core, or the native walk): (ranks, tokens),
        both int64 (R,B). embed None: the table of prepare_inference(embed, table_only=True). With the anchor
        transition, hidden is (R,B+1,d) and anchor_ids (R,): the walk starts from the anchor, so k_1 =
        argmax_b S_0(b)."""
        fused.require_tensors(hidden=hidden, cand_ids=cand_ids, cand_logits=cand_logits)
        hidden, cand_ids, cand_logits = self._slots(hidden, cand_ids, cand_logits, anchor_ids, embed)
        if embed is None:
            embed = self._table_only()
        fused.require_tensors(embed=embed)
        prepared = self._fresh_prepared(embed)
        table, weights = (None, self.weights()) if prepared is None else (prepared.table, prepared.weights)
        if backend.native(hidden.device):
            ranks, tokens = native.correct(hidden, cand_ids, cand_logits, embed, weights, table)
        else:
            ranks, tokens = torch.ops.dcoco.correct(hidden, cand_ids, cand_logits, embed, *weights, table)
        return (ranks[:, 1:], tokens[:, 1:]) if self.anchor_transition else (ranks, tokens)

    def walk_inputs(self, scores: torch.Tensor, cand_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(first, grid) from score()'s output: what select, sample and correction_loss take. first (R,K) scores
        slot 1's candidates: the drafter's logits l_1, or S_0 with the anchor transition (row 0 of the anchor's
        grid; correction_loss's anchor_scores); grid (R,B-1,K,K) holds S_1..S_{B-1}."""
        if self.anchor_transition:
            return scores[:, 0, 0], scores[:, 1:]
        return cand_logits[:, 0], scores

    def _slots(self, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
               anchor_ids: torch.Tensor | None, embed: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The core's inputs: as given, or with the anchor as slot 0 (K copies of its id, logits 0). An anchor
        outside [0, V) is an IndexError naming it on the CPU (eager); elsewhere a check would sync with the host,
        and the core treats it as it treats any such candidate id."""
        if not self.anchor_transition:
            if anchor_ids is not None:
                raise ValueError("anchor_ids: this corrector has no anchor transition (anchor_transition=False); "
                                 "pass None")
            return hidden, cand_ids, cand_logits
        if anchor_ids is None:
            raise ValueError("anchor_ids: the anchor transition is on: expected the (R,) anchor tokens, got None")
        fused.require_tensors(anchor_ids=anchor_ids)
        checks.dims("cand_ids", cand_ids, 3)
        if hidden.dim() != 3 or hidden.shape[:2] != (cand_ids.shape[0], cand_ids.shape[1] + 1):
            raise ValueError(f"hidden: the anchor transition is on: expected (R,B+1,d), position 0 the anchor's, for "
                             f"cand_ids (R,B,K); got {tuple(hidden.shape)} and {tuple(cand_ids.shape)}")
        R, B, K = cand_ids.shape
        if B < 1:
            raise ValueError("hidden: expected at least one drafted slot (B >= 1), got B=0")
        if anchor_ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"anchor_ids: expected int32 or int64, got {anchor_ids.dtype}")
        if anchor_ids.shape != (R,) or anchor_ids.device != cand_ids.device:
            raise ValueError(f"anchor_ids: expected an int32/int64 ({R},) tensor on {cand_ids.device}, got "
                             f"{anchor_ids.dtype} {tuple(anchor_ids.shape)} on {anchor_ids.device}")
        # the wider of the two id dtypes: an int64 anchor is never narrowed (2^32 + 3 must not become token 3), so
        # the core's range check sees the id as given
        vocab = embed if embed is not None else self._stand_in
        if native.checks_ids(anchor_ids) and isinstance(vocab, torch.Tensor) and vocab.dim() == 2:
            bad = ((anchor_ids < 0) | (anchor_ids >= vocab.shape[0])).nonzero()
            if len(bad):
                r = int(bad[0, 0])
                raise IndexError(f"anchor_ids[{r}] = {int(anchor_ids[r])} is outside [0, V={vocab.shape[0]})")
        dtype = anchor_ids.dtype if anchor_ids.dtype.itemsize > cand_ids.dtype.itemsize else cand_ids.dtype
        ids = torch.cat([anchor_ids.to(dtype)[:, None, None].expand(R, 1, K), cand_ids.to(dtype)], 1)
        return hidden, ids, F.pad(cand_logits, (0, 0, 1, 0))

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
        Nothing then notices the embedding changing: prepare again after it does. Given the embedding again, a
        call checks it as after a full preparation."""
        fused.require_tensors(embed=embed)
        if not isinstance(table_only, bool):
            raise TypeError(f"table_only: expected a bool, got {table_only!r}")
        args = (embed, self.cand_proj.weight, self.fuse_proj.weight)
        table = native.cand_table(*args) if backend.native(embed.device) else torch.ops.dcoco.cand_table(*args)
        # always copies, never the parameters themselves (.to() of a float32 tensor returns it): a later refill
        # writes into these, which must not be tensors an optimizer or the caller still holds
        weights = tuple(w.detach().to(torch.float32, copy=True).contiguous() for w in self.weights())
        before = self._prepared
        if before is not None and _same_layout((table, *weights), (before.table, *before.weights)) \
                and (torch.is_inference_mode_enabled() or not before.table.is_inference()):
            # prepared before: refill the same tensors, which a captured CUDA graph keeps reading (tensors made
            # under inference_mode cannot be written outside it: those are replaced)
            old_table, old_weights = before.table, before.weights
            for old, new in zip((old_table, *old_weights), (table, *weights)):
                old.copy_(new)
            table, weights = old_table, old_weights
        self._stand_in = embed.new_zeros(()).expand(embed.shape) if table_only else None
        self._prepared = Prepared(self._embed_key(embed), self._weights_key(), table, weights)
        return table

    def unprepare(self) -> None:
        """Drop what prepare_inference kept: forward then computes from the embedding table."""
        self._prepared = self._stand_in = None

    @property
    def prepared(self) -> bool:
        """Whether prepare_inference has run (and not been dropped as stale since)."""
        return self._prepared is not None

    @staticmethod
    def _embed_key(embed: torch.Tensor) -> tuple:
        return embed.data_ptr(), embed.shape, _version(embed)

    def _weights_key(self) -> tuple:
        return tuple((w.data_ptr(), _version(w)) for w in self.weights())

    def _table_only(self) -> torch.Tensor:
        """The stand-in embedding of a table-only preparation, whose weights must be those it was prepared with."""
        prepared = self._prepared  # set together with _stand_in (prepare_inference), dropped together
        if self._stand_in is None or prepared is None:
            raise ValueError("embed: expected the (V, d) embedding table; None only after "
                             "prepare_inference(embed, table_only=True)")
        if not torch.compiler.is_compiling() and self._weights_key() != prepared.weights_key:
            self._prepared = self._stand_in = None
            raise ValueError("embed: the table-only preparation is stale (the weights changed since "
                             "prepare_inference); call prepare_inference(embed, table_only=True) again")
        return self._stand_in

    def _fresh_prepared(self, embed: torch.Tensor) -> Prepared | None:
        p = self._prepared
        if p is None or torch.compiler.is_compiling():
            return p
        # table-only (embed is the stand-in): the weights alone are checked
        same_embed = embed is self._stand_in or self._embed_key(embed) == p.embed_key
        if not same_embed or self._weights_key() != p.weights_key or p.table.device != embed.device:
            warnings.warn("dcoco.Corrector: the inference preparation is stale (weights or embed changed since "
                          "prepare_inference); computing from the embedding table instead", stacklevel=3)
            self._prepared = self._stand_in = None
        return self._prepared


@dataclasses.dataclass
class Prepared:
    """What prepare_inference keeps: the identity of what it was made from, and the tensors the calls then read."""
    embed_key: tuple                   # (data_ptr, shape, version) of the embedding table
    weights_key: tuple                 # (data_ptr, version) of each weight
    table: torch.Tensor                # (V, r) float32: W_fuse[:, :r] LN(W_cand E[v])
    weights: tuple[torch.Tensor, ...]  # float32 copies of the weights, refilled in place on a re-preparation


def _version(t: torch.Tensor) -> int | None:
    """t's in-place write counter; None for an inference tensor (torch.inference_mode), which keeps none."""
    return None if t.is_inference() else t._version


def _same_layout(new: tuple, old: tuple) -> bool:
    return len(new) == len(old) and all(a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
                                        for a, b in zip(new, old))
