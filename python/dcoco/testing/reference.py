"""The literal DCOCO formula in plain PyTorch, for tests only: slow, materialises every 386-wide
MLP input, no rewrites. Computes in the dtype of `hidden` after promotion to at least float32
(pass float64 inputs for a high-precision reference)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _promoted(hidden, cand_logits, *weights):
    """(dtype, hidden, logits, weights) in hidden's dtype promoted to at least float32."""
    dt = torch.promote_types(hidden.dtype, torch.float32)
    return dt, hidden.to(dt), cand_logits.to(dt), tuple(t.to(dt) for t in weights)


def score(hidden, cand_ids, cand_logits, embed, cand_proj, ctx_proj, fuse_proj, fuse_norm_weight, fuse_norm_bias,
          pair_proj, mlp0_weight, mlp0_bias, mlp2_weight, mlp2_bias) -> torch.Tensor:
    """scores (R,B-1,K,K): scores[r,p,a,b] = l_{p+1}(b) + MLP([s_p ; z_pa ; z_{p+1,b} ; l_p(a) ; l_{p+1}(b)])."""
    dt, h, l, (Wc, Wx, Wf, gamma, beta, Wp, W1, b1, W2, b2) = _promoted(
        hidden, cand_logits, cand_proj, ctx_proj, fuse_proj, fuse_norm_weight, fuse_norm_bias, pair_proj, mlp0_weight,
        mlp0_bias, mlp2_weight, mlp2_bias)
    R, B, K = cand_ids.shape
    r = Wc.shape[0]
    b = F.layer_norm(embed[cand_ids.long()].to(dt) @ Wc.T, (r,), eps=1e-5)      # (R,B,K,r)
    g = F.layer_norm(h @ Wx.T, (r,), eps=1e-5)                                   # (R,B,r)
    z = F.layer_norm(torch.cat([b, g[:, :, None].expand(R, B, K, r)], -1) @ Wf.T, (r,), gamma, beta, eps=1e-5)
    s = torch.cat([h[:, :-1], h[:, 1:]], -1) @ Wp.T                               # (R,B-1,r)
    T = B - 1
    x = torch.cat([
        s[:, :, None, None].expand(R, T, K, K, r),
        z[:, :-1, :, None].expand(R, T, K, K, r),
        z[:, 1:, None, :].expand(R, T, K, K, r),
        l[:, :-1, :, None, None].expand(R, T, K, K, 1),
        l[:, 1:, None, :, None].expand(R, T, K, K, 1),
    ], -1)                                                                        # (R,B-1,K,K,3r+2)
    delta = (F.gelu(x @ W1.T + b1) @ W2.T + b2)[..., 0]
    return l[:, 1:, None, :] + delta


def greedy(scores: torch.Tensor, first_logits: torch.Tensor) -> torch.Tensor:
    """Prefix-first greedy, literally: ranks (R,B). Ties to the lower rank (first maximum)."""
    R, T, K, _ = scores.shape
    ranks = torch.empty((R, T + 1), dtype=torch.int64)
    for q in range(R):
        k = int(torch.argmax(first_logits[q]))
        ranks[q, 0] = k
        for p in range(T):
            k = int(torch.argmax(scores[q, p, k]))
            ranks[q, p + 1] = k
    return ranks


def forward(hidden, cand_ids, cand_logits, embed, *weights) -> tuple[torch.Tensor, torch.Tensor]:
    """(ranks, tokens) of the greedy walk over the literal scores."""
    scores = score(hidden, cand_ids, cand_logits, embed, *weights)
    ranks = greedy(scores, cand_logits[:, 0].to(scores.dtype))
    return ranks, torch.gather(cand_ids.long(), 2, ranks[..., None])[..., 0]


def anchor_scores(hidden, cand_ids, cand_logits, anchor_ids, embed, cand_proj, ctx_proj, fuse_proj, fuse_norm_weight,
                  fuse_norm_bias, pair_proj, mlp0_weight, mlp0_bias, mlp2_weight, mlp2_bias) -> torch.Tensor:
    """The anchor transition, literally: S_0 (R,K) = l_1(b) + MLP([s_0 ; z_0 ; z_1b ; 0 ; l_1(b)]) with
    z_0 = LN_gb(W_fuse [LN(W_cand E[t_0]) ; LN(W_ctx h_0)]), s_0 = W_pair [h_0 ; h_1]; hidden (R,B+1,d), position 0
    the anchor's, cand_ids / cand_logits (R,B,K), anchor_ids (R,)."""
    dt, h, l, (Wc, Wx, Wf, gamma, beta, Wp, W1, b1, W2, b2) = _promoted(
        hidden, cand_logits, cand_proj, ctx_proj, fuse_proj, fuse_norm_weight, fuse_norm_bias, pair_proj, mlp0_weight,
        mlp0_bias, mlp2_weight, mlp2_bias)
    R, _, K = cand_ids.shape
    r = Wc.shape[0]

    def z(ids, hid):  # ids (R,n), hid (R,d) -> (R,n,r)
        b = F.layer_norm(embed[ids.long()].to(dt) @ Wc.T, (r,), eps=1e-5)
        g = F.layer_norm(hid @ Wx.T, (r,), eps=1e-5)[:, None].expand_as(b)
        return F.layer_norm(torch.cat([b, g], -1) @ Wf.T, (r,), gamma, beta, eps=1e-5)

    z0 = z(anchor_ids[:, None], h[:, 0])                                        # (R,1,r)
    z1 = z(cand_ids[:, 0], h[:, 1])                                             # (R,K,r)
    s0 = torch.cat([h[:, 0], h[:, 1]], -1) @ Wp.T                               # (R,r)
    x = torch.cat([s0[:, None].expand(R, K, r), z0.expand(R, K, r), z1, torch.zeros_like(l[:, 0, :, None]),
                   l[:, 0, :, None]], -1)                                       # (R,K,3r+2)
    return l[:, 0] + (F.gelu(x @ W1.T + b1) @ W2.T + b2)[..., 0]


def best_path(scores: torch.Tensor, first: torch.Tensor, lam: float = 1.0) -> torch.Tensor:
    """The path rules by brute force over all K^B paths (small shapes only): ranks (R,B) of the path maximising
    first(k_1) + sum_{p=1..B-1} lam^(p-1) S_p(k_p, k_{p+1}) in float64, with first = l_1 or the anchor
    transition's S_0; lam = 1 is Global-Sum. Ties: the lowest ranks at the earliest slot (the lexicographic
    order of the paths). For finite scores (a path worth NaN loses to every number)."""
    R, T, K, _ = scores.shape
    s, f = scores.double(), first.double()
    paths = torch.cartesian_prod(*[torch.arange(K)] * (T + 1)).view(-1, T + 1)  # lexicographic order
    out = torch.zeros(R, T + 1, dtype=torch.int64)
    for q in range(R):
        value = f[q, paths[:, 0]]
        for p in range(T):
            value = value + lam ** p * s[q, p, paths[:, p], paths[:, p + 1]]
        out[q] = paths[int(torch.argmax(torch.where(value.isnan(), -torch.inf, value)))]  # the first maximum
    return out
