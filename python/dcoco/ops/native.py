"""The native backend: DCOCO's math (docs/spec.md) in plain PyTorch, on any device and in any build, shaped for a
GPU: a few dozen whole-tensor ops per call, whatever the block size, instead of a loop over slots.

The fused core's exact rewrites, as tensor ops: the vocabulary table (or its rows computed from the
embedding), the split pair projection W_pair[:, :d] h_p + W_pair[:, d:] h_{p+1} (one GEMM over the two halves
viewed as 2r rows), and the rank split of the first MLP layer (u_p + pred_pa + succ_pb before the GELU). The MLP
then runs over every transition at once, the whole (R, B-1, K, K) grid. The walks need no loop over slots
either:
- greedy: the successor each predecessor gets, f_p(a) = argmax_b S_p(a, b), does not depend on the path, so
  one argmax over the grid gives every map, and k_{p+1} = f_p(k_p) is a prefix composition of maps on
  {0..K-1}: pointer doubling, ceil(log2(B-1)) rounds of one gather each;
- global / geometric: the best suffix values V_p(a) are max-plus products of the K x K transition matrices,
  a suffix scan of ceil(log2(B-1)) batched max-plus products; each node's best successor is then one argmax
  over the grid, and the path is read forwards by the same pointer doubling.
Ties go to the lower rank (torch's argmax takes the first maximum), NaN loses to every number (it becomes -inf
before every max). The path rules add the transitions in a tree order, so a near tie may resolve otherwise
than in the core's right-to-left sum (same value up to float rounding; exact ties are the same).
Arithmetic in float32 (float64 when an input is float64), autocast off inside, as in the core. No host sync,
no data-dependent shape, no Python branch on tensor values (but the CPU's eager id check), so it traces under
torch.compile(fullgraph=True) and captures in CUDA graphs. Gradients come from autograd. Requests go through
in chunks whose (rows, B-1, K, K, H) pre-activations stay under GRID_BYTES without autograd, or CHUNK_BYTES
with it (recomputed in the backward, torch.utils.checkpoint), so memory stays flat at any R.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.compiler import is_compiling
from torch.utils.checkpoint import checkpoint

from .checks import check_inputs, check_select, check_table_args, precision

CHUNK_BYTES = 32 << 20  # with autograd, per chunk of requests: (rows,B-1,K,K,H) pre-activations or (rows,B,K,d) rows
GRID_BYTES = 128 << 20  # without autograd (one buffer, GELU in place): R = 32 at B=15, K=16, H=256 is one chunk
TABLE_ROWS = 8192        # vocabulary rows per step of cand_table
EPS = 1e-5
NEG_INF = float("-inf")


def _no_autocast(device: torch.device):
    """The math runs in float32 whatever autocast says, as the fused kernel does."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _rows_per_chunk(elements_per_row: int, itemsize: int, budget: int) -> int:
    return max(1, budget // max(elements_per_row * itemsize, 1))


def _chunks(budget: int, R: int, B: int, K: int, d: int, H: int, itemsize: int, embed_rows: bool) -> int:
    """Requests per chunk: the largest intermediate of a chunk (the pre-activations, or the candidates'
    embedding rows when there is no table) stays under budget."""
    return _rows_per_chunk(max((B - 1) * K * K * H, B * K * d if embed_rows else 0), itemsize, budget)


def checks_ids(ids: torch.Tensor) -> bool:
    """Whether ids are range-checked here: on the CPU, eager. Elsewhere a check would sync with the host."""
    return ids.device.type == "cpu" and not is_compiling()


def _checked_ids(cand_ids: torch.Tensor, cand_logits: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ids in [0, V). On the CPU (eager) an id outside raises IndexError naming it, as the fused core
    does; elsewhere a check would sync with the host, so, like the CUDA kernel, such a candidate reads a row
    in range and gets a NaN logit: it is never selected."""
    ids = cand_ids.long()
    if checks_ids(ids):
        bad = (ids < 0) | (ids >= V)
        if bad.any():
            q, p, k = (int(i) for i in bad.nonzero()[0])
            raise IndexError(f"cand_ids[{q}, {p}, {k}] = {int(ids[q, p, k])} is outside [0, V={V})")
        return ids, cand_logits
    safe = ids.clamp(0, max(V - 1, 0))
    return safe, cand_logits.masked_fill(safe != ids, float("nan"))


def _nan_loses(v: torch.Tensor) -> torch.Tensor:
    """v with NaN as -inf (infinities kept): NaN then loses every max, as in the core."""
    return v.nan_to_num(nan=NEG_INF, posinf=float("inf"), neginf=NEG_INF)


def _argmax(v: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim in the core's order: NaN loses to every number, ties go to the lower index
    (torch's argmax returns the first maximum; an all-NaN row gives 0)."""
    return _nan_loses(v).argmax(-1)


def _compose(f: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Ranks (R, T+1) of k, then k = f[:, p, k] for p = 0..T-1: f (R,T,K) int64 maps, k (R,) the start.
    The start is a constant map put in front; pointer doubling then composes every prefix (after the round of
    stride s, g[:, p] = g_p o ... o g_{p-2s+1}), ceil(log2(T+1)) rounds of one gather each, and each prefix,
    a constant map by then, holds its slot's rank."""
    R, T, K = f.shape
    g, s = torch.cat([k[:, None, None].expand(R, 1, K), f], 1), 1
    while s < T + 1:
        g = torch.cat([g[:, :s], g[:, s:].gather(2, g[:, :-s])], 1)
        s *= 2
    return g[:, :, 0]


def _table_rows(e, Wc, Wf) -> torch.Tensor:
    """W_fuse[:, :r] LN(W_cand e) for embedding rows e (..., d): rows of the vocabulary table."""
    r = Wc.shape[0]
    return F.linear(F.layer_norm(F.linear(e.to(Wc.dtype), Wc), (r,), eps=EPS), Wf[:, :r])


def _grid(h, ids, l, embed, table, Wc, Wx, Wf, gamma, beta, Wp, W1, b1, W2, b2) -> torch.Tensor:
    """scores (R,B-1,K,K) of one chunk of requests, every transition at once. Without autograd the
    pre-activations are one buffer, the GELU applied in place."""
    R, B, K = ids.shape
    d, r = h.shape[-1], Wc.shape[0]
    h, l = h.to(Wc.dtype), l.to(Wc.dtype)
    rows = F.embedding(ids, table).to(Wc.dtype) if table is not None else _table_rows(F.embedding(ids, embed), Wc, Wf)
    g = F.linear(F.layer_norm(F.linear(h, Wx), (r,), eps=EPS), Wf[:, r:])                # (R,B,r)
    z = F.layer_norm(rows + g[:, :, None], (r,), gamma, beta, eps=EPS)                   # (R,B,K,r)
    halves = F.linear(h, Wp.reshape(2 * r, d)).view(R, B, r, 2)  # row 2i: W_pair[i, :d], 2i+1: W_pair[i, d:]
    u = F.linear(halves[:, :-1, :, 0] + halves[:, 1:, :, 1], W1[:, :r], b1)             # (R,T,H)
    # projected over all B slots, then sliced: a slice of z would not flatten to a GEMM without a copy
    pred = torch.addcmul(F.linear(z, W1[:, r:2 * r])[:, :-1], l[:, :-1, :, None], W1[:, 3 * r])       # (R,T,K,H)
    succ = torch.addcmul(F.linear(z, W1[:, 2 * r:3 * r])[:, 1:], l[:, 1:, :, None], W1[:, 3 * r + 1])  # (R,T,K,H)
    x = (u[:, :, None] + pred)[:, :, :, None] + succ[:, :, None]                          # (R,T,K,K,H)
    x = torch.ops.aten.gelu_(x) if not torch.is_grad_enabled() else F.gelu(x)
    return F.linear(x, W2, b2)[..., 0] + l[:, 1:, None, :]


def score(hidden, cand_ids, cand_logits, embed, weights, table=None) -> torch.Tensor:
    """scores[r,p,a,b] = S_{p+1}(a,b), (R,B-1,K,K) float32 (float64 for float64 inputs), differentiable in
    hidden, cand_logits and the weights (not in embed or the ids). table (the vocabulary table of
    cand_table) replaces the candidates' embedding rows: inference only, it carries no gradient to the
    candidate and fuse projections."""
    sizes = check_inputs(hidden, cand_ids, cand_logits, embed, weights, table, float64=True)
    ids, logits = _checked_ids(cand_ids, cand_logits, sizes[4])
    return _scores(hidden, ids, logits, embed, weights, table, precision(hidden, cand_logits, embed, weights), sizes)


def _scores(hidden, ids, logits, embed, weights, table, dt, sizes) -> torch.Tensor:
    R, B, K, d, V, r, H = sizes
    embed = embed.detach()  # frozen (docs/spec.md, "Shapes and names"): never a gradient, as in the fused op
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (hidden, logits, *weights))
    step = _chunks(CHUNK_BYTES if grad else GRID_BYTES, R, B, K, d, H, dt.itemsize, table is None)
    with _no_autocast(hidden.device), torch.set_grad_enabled(grad):
        ws = [w.to(dt) for w in weights]
        parts = []
        # split, not slices: one backward node joins the chunks' input gradients (a slice's would fill a
        # whole (R,B,d) tensor per chunk)
        for h, i, lg in zip(hidden.split(step), ids.split(step), logits.split(step)):
            args = (h, i, lg, embed, table, *ws)
            parts.append(checkpoint(_grid, *args, use_reentrant=False) if grad else _grid(*args))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def correct(hidden, cand_ids, cand_logits, embed, weights, table=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefix-first greedy re-selection: (ranks, tokens), both int64 (R,B). Not differentiable."""
    sizes = check_inputs(hidden, cand_ids, cand_logits, embed, weights, table)
    ids, logits = _checked_ids(cand_ids, cand_logits, sizes[4])
    with torch.no_grad():
        scores = _scores(hidden, ids, logits, embed, weights, table, torch.float32, sizes)
        ranks = _compose(_argmax(scores), _argmax(logits[:, 0]))
    return ranks, cand_ids.long().gather(2, ranks[..., None])[..., 0]


def cand_table(embed, cand_proj, fuse_proj) -> torch.Tensor:
    """The vocabulary table W_fuse[:, :r] LN(W_cand E[v]), (V,r) float32, TABLE_ROWS rows at a time."""
    V, d, r = check_table_args(embed, cand_proj, fuse_proj)
    with torch.no_grad(), _no_autocast(embed.device):
        Wc, Wf = cand_proj.to(torch.float32), fuse_proj.to(torch.float32)
        return torch.cat([_table_rows(embed[i:i + TABLE_ROWS], Wc, Wf) for i in range(0, max(V, 1), TABLE_ROWS)])


def _max_plus(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(a (x) b)[..., i, j] = max_k a[..., i, k] + b[..., k, j]; NaN (from inf - inf) loses."""
    return _nan_loses(a[..., :, :, None] + b[..., None, :, :]).amax(-2)


def select(scores, first_logits, rule: str, lam: float) -> torch.Tensor:
    """Ranks (R,B) int64 of the chosen path (greedy, global, geometric), in the core's order: NaN loses to
    every number; ties go to the lower rank, at the earliest slot for the path rules."""
    R, B, K = check_select(scores, first_logits, rule, lam)
    s, first = scores.float(), first_logits.float()
    if rule == "greedy":
        return _compose(_argmax(s), _argmax(first))
    T = B - 1
    if rule == "geometric" and lam != 1.0 and T:  # weight lam^p on transition p (lam = 1: Global-Sum)
        s = s * torch.logspace(0, T - 1, T, base=lam, dtype=torch.float32, device=s.device)[:, None, None]
    m = _nan_loses(s)
    # suffix scan: after the round of stride t, m[:, p] = M_p (x) ... (x) M_{p+2t-1} (fewer at the end)
    t = 1
    while t < T:
        m = torch.cat([_max_plus(m[:, :T - t], m[:, t:]), m[:, T - t:]], 1)
        t *= 2
    best = m.amax(-1)                            # (R,T,K): V_p(a), the best value of a path on from slot p's node a
    after = F.pad(best[:, 1:], (0, 0, 0, 1))     # V_{p+1}(b), 0 after the last slot
    nxt = _argmax(s + after[:, :, None, :])      # (R,T,K): each node's best successor
    return _compose(nxt, _argmax(first + best[:, 0] if T else first))
