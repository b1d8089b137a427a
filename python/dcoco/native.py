"""The native backend: DCOCO's math (SPEC.md) in plain PyTorch, on any device and in any build.

The fused core's exact rewrites, as tensor ops: the vocabulary table (or its rows computed from the
embedding), the split pair projection W_pair[:, :d] h_p + W_pair[:, d:] h_{p+1}, the rank split of the first
MLP layer (u_p + pred_pa + succ_pb before the GELU), and a greedy walk that scores only the chosen
predecessor's row. Arithmetic in float32 (float64 when an input is float64), autocast off inside, as in the
core. No host sync, no data-dependent shape, no Python branch on tensor values (but the CPU's eager id
check), so it traces under torch.compile(fullgraph=True) and captures in CUDA graphs. Gradients come from
autograd. Requests go through in chunks whose largest intermediate is about CHUNK_BYTES, recomputed in the
backward (torch.utils.checkpoint), so the (R,B-1,K,K,H) pre-activations never exist whole.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.compiler import is_compiling
from torch.utils.checkpoint import checkpoint

from .checks import check_inputs, check_select, check_table_args, precision

CHUNK_BYTES = 32 << 20  # per chunk of requests: (rows,B-1,K,K,H) pre-activations or (rows,B,K,d) embedding rows
TABLE_ROWS = 8192        # vocabulary rows per step of cand_table
EPS = 1e-5


def _no_autocast(device: torch.device):
    """The math runs in float32 whatever autocast says, as the fused kernel does."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _rows_per_chunk(elements_per_row: int, itemsize: int) -> int:
    return max(1, CHUNK_BYTES // max(elements_per_row * itemsize, 1))


def _checked_ids(cand_ids: torch.Tensor, cand_logits: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ids in [0, V). On the CPU (eager) an id outside raises IndexError naming it, as the fused core
    does; elsewhere a check would sync with the host, so, like the CUDA kernel, such a candidate reads row 0
    and gets a NaN logit: it is never selected."""
    ids = cand_ids.long()
    bad = (ids < 0) | (ids >= V)
    if ids.device.type == "cpu" and not is_compiling():
        if bad.any():
            q, p, k = (int(i) for i in bad.nonzero()[0])
            raise IndexError(f"cand_ids[{q}, {p}, {k}] = {int(ids[q, p, k])} is outside [0, V={V})")
        return ids, cand_logits
    return ids.masked_fill(bad, 0), cand_logits.masked_fill(bad, float("nan"))


def _argmax(v: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim in the core's order: NaN loses to every number, ties go to the lower index
    (an all-NaN row gives 0)."""
    best = v.masked_fill(v.isnan(), float("-inf")).amax(-1, keepdim=True)
    return (v == best).to(torch.uint8).argmax(-1)


def _follow(k: torch.Tensor, steps: int, step) -> torch.Tensor:
    """Ranks (R, steps+1) of a left-to-right read: k, then k = step(p, k) for p = 0..steps-1."""
    ranks = [k]
    for p in range(steps):
        k = step(p, k)
        ranks.append(k)
    return torch.stack(ranks, 1)


def _table_rows(e, Wc, Wf) -> torch.Tensor:
    """W_fuse[:, :r] LN(W_cand e) for embedding rows e (..., d): rows of the vocabulary table."""
    r = Wc.shape[0]
    return F.layer_norm(e.to(Wc.dtype) @ Wc.T, (r,), eps=EPS) @ Wf[:, :r].T


def _cand_rows(ids, embed, table, Wc, Wf) -> torch.Tensor:
    """The table's rows per candidate (R,B,K,r): gathered from the table, or computed from embed."""
    if table is not None:
        return F.embedding(ids, table).to(Wc.dtype)
    return _table_rows(F.embedding(ids, embed), Wc, Wf)


def _fused_candidates(h, ids, embed, table, Wc, Wx, Wf, gamma, beta) -> torch.Tensor:
    """z (R,B,K,r) = LN_gb(W_fuse [b ; g]) with the fuse projection split over its two halves."""
    r = Wc.shape[0]
    g = F.layer_norm(h @ Wx.T, (r,), eps=EPS)                                            # (R,B,r)
    bf = _cand_rows(ids, embed, table, Wc, Wf)                                            # (R,B,K,r)
    return F.layer_norm(bf + (g @ Wf[:, r:].T)[:, :, None], (r,), gamma, beta, eps=EPS)


def _pair_terms(h, Wp, W1, b1) -> torch.Tensor:
    """u (R,B-1,H) = W1_s s_p + b1 with s_p = W_pair[:, :d] h_p + W_pair[:, d:] h_{p+1}."""
    d, r = h.shape[-1], Wp.shape[0]
    s = h[:, :-1] @ Wp[:, :d].T + h[:, 1:] @ Wp[:, d:].T
    return s @ W1[:, :r].T + b1


def _score_rows(h, ids, l, embed, Wc, Wx, Wf, gamma, beta, Wp, W1, b1, W2, b2) -> torch.Tensor:
    """scores (R,B-1,K,K) of one chunk of requests."""
    r = Wc.shape[0]
    h, l = h.to(Wc.dtype), l.to(Wc.dtype)
    z = _fused_candidates(h, ids, embed, None, Wc, Wx, Wf, gamma, beta)
    u = _pair_terms(h, Wp, W1, b1)                                                         # (R,T,H)
    pred = z[:, :-1] @ W1[:, r:2 * r].T + l[:, :-1, :, None] * W1[:, 3 * r]                # (R,T,K,H)
    succ = z[:, 1:] @ W1[:, 2 * r:3 * r].T + l[:, 1:, :, None] * W1[:, 3 * r + 1]          # (R,T,K,H)
    x = u[:, :, None, None] + pred[:, :, :, None] + succ[:, :, None]                       # (R,T,K,K,H)
    return F.gelu(x) @ W2[0] + b2 + l[:, 1:, None, :]


def _walk_rows(h, ids, l, embed, table, Wc, Wx, Wf, gamma, beta, Wp, W1, b1, W2, b2) -> torch.Tensor:
    """Prefix-first greedy ranks (R,B) of one chunk: K x H GELUs per step, never the K^2 grid."""
    r = Wc.shape[0]
    h, l = h.to(Wc.dtype), l.to(Wc.dtype)
    z = _fused_candidates(h, ids, embed, table, Wc, Wx, Wf, gamma, beta)                  # (R,B,K,r)
    u = _pair_terms(h, Wp, W1, b1)                                                         # (R,T,H)
    W1a, W1b, w_la, w_lb = W1[:, r:2 * r], W1[:, 2 * r:3 * r], W1[:, 3 * r], W1[:, 3 * r + 1]

    def step(p, k):
        zk = z[:, p].gather(1, k[:, None, None].expand(-1, 1, r))[:, 0]                   # (R,r)
        pred = zk @ W1a.T + l[:, p].gather(1, k[:, None]) * w_la                          # (R,H)
        succ = z[:, p + 1] @ W1b.T + l[:, p + 1, :, None] * w_lb                           # (R,K,H)
        return _argmax(F.gelu(u[:, p, None] + pred[:, None] + succ) @ W2[0] + b2 + l[:, p + 1])  # over (R,K)

    return _follow(_argmax(l[:, 0]), h.shape[1] - 1, step)


def score(hidden, cand_ids, cand_logits, embed, weights) -> torch.Tensor:
    """scores[r,p,a,b] = S_{p+1}(a,b), (R,B-1,K,K) float32 (float64 for float64 inputs), differentiable in
    hidden, cand_logits and the weights (not in embed or the ids)."""
    R, B, K, d, V, r, H = check_inputs(hidden, cand_ids, cand_logits, embed, weights, float64=True)
    dt = precision(hidden, cand_logits, embed, weights)
    ids, logits = _checked_ids(cand_ids, cand_logits, V)
    embed = embed.detach()  # frozen (SPEC.md): never a gradient, as in the fused op
    step = _rows_per_chunk(max((B - 1) * K * K * H, B * K * d), dt.itemsize)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (hidden, cand_logits, *weights))
    with _no_autocast(hidden.device):
        ws = [w.to(dt) for w in weights]
        parts = []
        # split, not slices: one backward node joins the chunks' input gradients (a slice's would fill a
        # whole (R,B,d) tensor per chunk)
        for h, i, lg in zip(hidden.split(step), ids.split(step), logits.split(step)):
            args = (h, i, lg, embed, *ws)
            parts.append(checkpoint(_score_rows, *args, use_reentrant=False) if grad else _score_rows(*args))
        return torch.cat(parts)


def correct(hidden, cand_ids, cand_logits, embed, weights, table=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefix-first greedy re-selection: (ranks, tokens), both int64 (R,B). Not differentiable."""
    R, B, K, d, V, r, H = check_inputs(hidden, cand_ids, cand_logits, embed, weights, table)
    ids, logits = _checked_ids(cand_ids, cand_logits, V)
    step = _rows_per_chunk(B * K * (r if table is not None else d), 4)  # the walk itself holds (rows,K,H)
    with torch.no_grad(), _no_autocast(hidden.device):
        ws = [w.to(torch.float32) for w in weights]
        ranks = torch.cat([_walk_rows(h, i, lg, embed, table, *ws)
                           for h, i, lg in zip(hidden.split(step), ids.split(step), logits.split(step))])
    return ranks, cand_ids.long().gather(2, ranks[..., None])[..., 0]


def cand_table(embed, cand_proj, fuse_proj) -> torch.Tensor:
    """The vocabulary table W_fuse[:, :r] LN(W_cand E[v]), (V,r) float32, TABLE_ROWS rows at a time."""
    V, d, r = check_table_args(embed, cand_proj, fuse_proj)
    with torch.no_grad(), _no_autocast(embed.device):
        Wc, Wf = cand_proj.to(torch.float32), fuse_proj.to(torch.float32)
        return torch.cat([_table_rows(embed[i:i + TABLE_ROWS], Wc, Wf) for i in range(0, max(V, 1), TABLE_ROWS)])


def select(scores, first_logits, rule: str, lam: float) -> torch.Tensor:
    """Ranks (R,B) int64 of the chosen path (greedy, global, geometric), in the core's order: NaN loses to
    every number; ties go to the lower rank, at the earliest slot for the path rules."""
    R, B, K = check_select(scores, first_logits, rule, lam)
    s, first = scores.float(), first_logits.float()
    if rule == "greedy":
        row = lambda p, k: s[:, p].gather(1, k[:, None, None].expand(-1, 1, K))[:, 0]  # noqa: E731  S_p(k, .)
        return _follow(_argmax(first), B - 1, lambda p, k: _argmax(row(p, k)))
    # Viterbi backwards (each node keeps its best successor), then read forwards: ties go to the lower rank
    # at the earliest slot. Weight lam^p on transition p (lam = 1: Global-Sum).
    lam = 1.0 if rule == "global" else lam
    after = torch.zeros_like(first)                                                        # (R,K) suffix values
    nxt = [None] * (B - 1)
    for p in range(B - 2, -1, -1):
        v = float(lam) ** p * s[:, p] + after[:, None, :]                                  # (R,K,K): a -> b
        nxt[p] = _argmax(v)                                                                # (R,K)
        after = v.gather(2, nxt[p][..., None])[..., 0]
    return _follow(_argmax(first + after), B - 1, lambda p, k: nxt[p].gather(1, k[:, None])[:, 0])
