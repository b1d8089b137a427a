"""Correctors trained on a frozen drafter's cached outputs. The drafter runs once over the corpus (every anchor,
up to a cap per sequence): its hidden states, top-K candidate ids and logits per drafted slot, the anchor token and
the verifier's tokens are kept; then every training step costs only the corrector. One contract for DCOCO's
corrector (L_corr), DFlash2's selector (its cross-entropy) and Domino's and DSpark's heads (their own losses, over
the whole vocabulary: the drafter's logits U are the cached hidden states through the target's head): the same
cache, steps, batch and optimizer."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..target.corpus import Corpus
from ..corrector import Corrector
from ..modeling.dflash import DFlashDrafter
from ..loss import correction_loss
from ..modeling.domino import DominoHead, curriculum
from ..modeling.dspark import DSparkHead
from ..modeling.selector import CandidateSelector
from .batches import _gen, sample_anchors
from .optim import warmup_cosine

KEYS = ("hidden", "anchor_hidden", "cand_ids", "cand_logits", "anchor_ids", "target", "valid")


@torch.no_grad()
def build(drafter: DFlashDrafter, data: Corpus, embed: torch.Tensor, head: torch.Tensor, num_candidates: int = 16,
          anchors: int = 64, seed: int = 0, path: str | Path | None = None,
          progress: bool = True) -> dict[str, torch.Tensor]:
    """{KEYS: tensors over every cached block}: hidden (N,B,d) float32 (what evaluation feeds), anchor_hidden (N,d)
    the drafter's state at the anchor position (the anchor transition's h_0), cand_ids / cand_logits (N,B,K) (rank
    order), anchor_ids (N,), target (N,B) the verifier's token at each slot, valid (N,B) inside the response.
    Up to `anchors` anchors per sequence (seeded). Loaded from / written to path (.safetensors) when given; a file
    without every key (written before anchor_hidden was kept) is built again."""
    from tqdm.auto import tqdm

    if path is not None and Path(path).is_file():
        cached = load_file(str(path))
        if set(cached) == set(KEYS):
            return cached
    B, dev = drafter.config.block_size - 1, drafter.fc.weight.device
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in KEYS}
    for i in tqdm(range(len(data)), desc="drafter outputs", unit="seq", disable=not progress):
        s = data[i]
        a = sample_anchors(s["response"], anchors, _gen(seed, i))
        if not len(a):
            continue
        S = len(s["ids"])
        block = drafter(s["ids"][None].long().to(dev), s["hidden"][None].to(dev), a[None].to(dev), embed)[0]
        h = block[:, 1:]
        ranked = DFlashDrafter.compute_logits(h, head).float().topk(num_candidates, -1)  # h (A,B,d)
        h, top = h.cpu(), [x.cpu() for x in ranked]
        parts["anchor_hidden"].append(block[:, 0].float().cpu())
        pos = a[:, None] + torch.arange(1, B + 1)
        at = pos.clamp(max=S - 1)
        parts["hidden"].append(h.float())
        parts["cand_logits"].append(top[0])
        parts["cand_ids"].append(top[1].int())
        parts["anchor_ids"].append(s["ids"][a].long())
        parts["target"].append(s["labels"][at].long())
        parts["valid"].append((pos < S) & s["response"][at])
    out = {k: torch.cat(v) for k, v in parts.items()}
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file(out, str(Path(path).with_suffix(".tmp")))
        Path(path).with_suffix(".tmp").replace(path)
    return out


Model = Corrector | CandidateSelector | DominoHead | DSparkHead


def objective(model: Model, b: dict[str, torch.Tensor], embed: torch.Tensor, head: torch.Tensor,
              rho: float = 4.0, done: float = 0.0) -> torch.Tensor:
    """The model's own loss on a batch of cached blocks: L_corr for DCOCO, the selector's cross-entropy, Domino's
    curriculum loss at lam = curriculum(done, 1) (done: the share of training behind), DSpark's loss against the
    point mass at the verifier's token (the corpus keeps the target's greedy tokens, not its distributions: that
    point mass is what greedy verification accepts, so c* is the draft's chance of acceptance)."""
    h, ids, vals = b["hidden"].float(), b["cand_ids"].long(), b["cand_logits"]
    if isinstance(model, (DominoHead, DSparkHead)):
        with torch.no_grad():
            U = DFlashDrafter.compute_logits(h, head).float()
        target = b["target"].long().masked_fill(~b["valid"], 0)  # past the response: weight 0, any id
        if isinstance(model, DominoHead):
            return model.loss(h, U, b["anchor_ids"], target, b["valid"], embed, curriculum(done, 1))[0]
        return model.loss(h, U, b["anchor_ids"], target, b["valid"])[0]
    if isinstance(model, Corrector):
        if not model.anchor_transition:
            return correction_loss(model.score(h, ids, vals, embed), ids, b["target"], b["valid"], rho)
        h = torch.cat([b["anchor_hidden"].float()[:, None], h], 1)
        first, grid = model.walk_inputs(model.score(h, ids, vals, embed, b["anchor_ids"]), vals)
        return correction_loss(grid, ids, b["target"], b["valid"], rho, first)
    return model.loss(h, ids, vals, b["anchor_ids"], b["target"], b["valid"])


def train(model: Model, cache: dict[str, torch.Tensor], embed: torch.Tensor, head: torch.Tensor, steps: int,
          batch: int = 256, lr: float = 6e-4, warmup: float = 0.04, seed: int = 0,
          progress: bool = True) -> dict:
    """AdamW with linear warm-up and cosine decay over `steps` steps of `batch` cached blocks drawn at random
    (seeded); returns {"steps", "seconds", "final_loss" (mean of the last 20)}."""
    from tqdm.auto import tqdm

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected an integer >= 1, got {steps!r}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = warmup_cosine(opt, max(1, round(warmup * steps)), steps)
    g = torch.Generator().manual_seed(seed)
    N, losses, t0 = len(cache["target"]), [], time.monotonic()
    model.train()
    bar = tqdm(range(steps), desc=f"{type(model).__name__} on cached drafts", disable=not progress)
    for step in bar:
        idx = torch.randint(0, N, (batch,), generator=g)
        loss = objective(model, {k: v[idx] for k, v in cache.items()}, embed, head, done=step / steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.4f}")
    model.eval()
    return {"steps": steps, "batch": batch, "seconds": time.monotonic() - t0,
            "final_loss": sum(losses[-20:]) / len(losses[-20:])}
