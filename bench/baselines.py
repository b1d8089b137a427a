"""The best PyTorch formulation we could write of the corrector's forward, as a speed baseline.

Same rewrites as the compiled core: the rank split of the first MLP layer, pair projection split into
W_pair[:, :d] h_p + W_pair[:, d:] h_{p+1}, optionally the vocabulary table, and a walk that scores only the
chosen predecessor's row (K x H GELUs per step, never the full K^2 grid)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def forward(hidden, cand_ids, cand_logits, embed, weights, table=None):
    Wc, Wx, Wf, gamma, beta, Wp, W1, b1, W2, b2 = (w.float() for w in weights)
    h, l = hidden.float(), cand_logits.float()
    R, B, K = cand_ids.shape
    d, r = h.shape[-1], Wc.shape[0]
    if table is None:
        bf = F.layer_norm(F.embedding(cand_ids, embed).float() @ Wc.T, (r,)) @ Wf[:, :r].T
    else:
        bf = F.embedding(cand_ids, table)
    g = F.layer_norm(h @ Wx.T, (r,))
    z = F.layer_norm(bf + (g @ Wf[:, r:].T)[:, :, None], (r,), gamma, beta)       # (R,B,K,r)
    pq = h @ torch.cat([Wp[:, :d], Wp[:, d:]]).T                                     # (R,B,2r)
    u = (pq[:, :-1, :r] + pq[:, 1:, r:]) @ W1[:, :r].T + b1                          # (R,B-1,H)
    succ = z[:, 1:] @ W1[:, 2 * r:3 * r].T + l[:, 1:, :, None] * W1[:, 3 * r + 1]   # (R,B-1,K,H)
    w1a, w_la, w2 = W1[:, r:2 * r], W1[:, 3 * r], W2[0]
    rows = torch.arange(R, device=h.device)
    k = l[:, 0].argmax(-1)
    ranks = [k]
    for p in range(B - 1):
        a = z[rows, p, k] @ w1a.T + l[rows, p, k, None] * w_la                       # (R,H)
        s = F.gelu(u[:, p, None] + a[:, None] + succ[:, p]) @ w2 + b2 + l[:, p + 1]  # (R,K)
        k = s.argmax(-1)
        ranks.append(k)
    ranks = torch.stack(ranks, 1)
    return ranks, cand_ids.gather(2, ranks[..., None])[..., 0]


def table(embed, cand_proj, fuse_proj):
    r = cand_proj.shape[0]
    return F.layer_norm(embed.float() @ cand_proj.float().T, (r,)) @ fuse_proj.float()[:, :r].T


def score(hidden, cand_ids, cand_logits, embed, weights):
    """The full score grid (R,B-1,K,K), differentiable: the training-time baseline of dcoco::score and its
    backward. Rank split of the first layer; the (R,B-1,K,K,H) pre-activations are materialised once."""
    Wc, Wx, Wf, gamma, beta, Wp, W1, b1, W2, b2 = (w.float() for w in weights)
    h, l = hidden.float(), cand_logits.float()
    d, r = h.shape[-1], Wc.shape[0]
    b = F.layer_norm(F.embedding(cand_ids, embed).float() @ Wc.T, (r,))
    g = F.layer_norm(h @ Wx.T, (r,))
    z = F.layer_norm(b @ Wf[:, :r].T + (g @ Wf[:, r:].T)[:, :, None], (r,), gamma, beta)   # (R,B,K,r)
    pq = h @ torch.cat([Wp[:, :d], Wp[:, d:]]).T                                             # (R,B,2r)
    u = (pq[:, :-1, :r] + pq[:, 1:, r:]) @ W1[:, :r].T + b1                                  # (R,B-1,H)
    pred = z[:, :-1] @ W1[:, r:2 * r].T + l[:, :-1, :, None] * W1[:, 3 * r]                # (R,B-1,K,H)
    succ = z[:, 1:] @ W1[:, 2 * r:3 * r].T + l[:, 1:, :, None] * W1[:, 3 * r + 1]
    x = u[:, :, None, None] + pred[:, :, :, None] + succ[:, :, None]                         # (R,B-1,K,K,H)
    return F.gelu(x) @ W2[0] + b2 + l[:, 1:, None, :]
