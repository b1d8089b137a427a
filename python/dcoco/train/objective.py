"""The training objective for one batch: the DFlash loss and L_corr (DCOCO), or a baseline head's own loss
(Domino's, DSpark's), and teacher-forced tau."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..corrector import Corrector
from ..modeling.dflash import DFlashDrafter, decayed_mean
from ..modeling.domino import DominoHead, curriculum
from ..modeling.dspark import DSparkHead
from ..modeling.head import shortlist_ce, topk_ce, whole_head_topk
from ..loss import correction_loss
from ..ops.select import select
from .config import TrainConfig


def corrector_scores(corrector: Corrector, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
                     embed: torch.Tensor, anchor_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Corrector scores with autograd (Corrector.score: (R,B-1,K,K), or (R,B,K,K) with the anchor transition, hidden
    then (R,B+1,d)): every training path goes through here, i.e. through the backend picked for the device
    (backend.py): dcoco::score and its compiled backward, or the native path."""
    return corrector.score(hidden, cand_ids, cand_logits, embed, anchor_ids)


Head = DominoHead | DSparkHead


class Objective(nn.Module):
    """Losses and teacher-forced tau for one batch; holds the trained modules (what DDP wraps). Slot j of the
    block at anchor p is supervised by labels[p+j], the verifier's argmax (every loss; on a greedy corpus it
    is the next corpus token), and valid while p+j is inside the sequence's response. corrector: DCOCO's, or a
    baseline's head (cfg.method); done: the share of the run behind, set by the loop (Domino's curriculum)."""

    def __init__(self, drafter: DFlashDrafter, corrector: Corrector | Head | None, cfg: TrainConfig,
                 vocab: torch.Tensor | None = None):
        super().__init__()
        self.drafter, self.corrector, self.cfg, self.vocab = drafter, corrector, cfg, vocab
        self.done = 0.0

    def forward(self, batch: dict[str, torch.Tensor], embed: torch.Tensor,
                head: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg, mode = self.cfg, self.cfg.mode
        ids, anchors, labels = batch["ids"], batch["anchors"], batch["labels"]
        (N, A), S, bs = anchors.shape, ids.shape[1], self.drafter.config.block_size
        pos = anchors[..., None] + torch.arange(1, bs, device=ids.device)                # (N,A,B) slot positions
        at = pos.clamp(max=S - 1).view(N, -1)
        target = labels.gather(1, at).view(N * A, bs - 1)
        teacher = None
        if cfg.distill is not None:  # the target's distribution at each slot (distillation)
            ids_p = [batch[k].gather(1, at[..., None].expand(-1, -1, cfg.distill)).view(N * A, bs - 1, -1)
                     for k in ("teacher_ids", "teacher_p")]
            teacher = (ids_p[0], ids_p[1])
        real = batch["anchor_ok"].reshape(-1)
        valid = ((pos < S) & batch["response"].gather(1, at).view(N, A, -1)).view(N * A, -1) & real[:, None]
        if isinstance(self.corrector, (DominoHead, DSparkHead)):
            return self._head(batch, target, valid, real, embed, head)

        with torch.set_grad_enabled(torch.is_grad_enabled() and mode != "corrector"):
            out_block = self.drafter(ids, batch["hidden"], anchors, embed)  # (N,A,bs,d): the anchor, then B slots
            h = out_block[:, :, 1:].reshape(N * A, bs - 1, -1)
            ce_labels = torch.where(valid, target, torch.zeros_like(target)) if mode != "corrector" else None
            shortlisted = self.vocab is not None and torch.is_grad_enabled()  # evaluation keeps all V rows
            ce: torch.Tensor | None
            if shortlisted:
                assert self.vocab is not None and ce_labels is not None  # grad on: mode is not "corrector"
                ce, values, cand_ids = shortlist_ce(h, head, ce_labels, self.vocab, cfg.num_candidates, teacher)
                if self.corrector is not None:  # joint: the corrector re-selects among the whole head's top-K
                    values, cand_ids = whole_head_topk(h, head, cfg.num_candidates, cfg.logit_chunk)
                    shortlisted = False  # cand_ids[..., 0] is the drafter's argmax again: tau_dflash
            else:  # row chunks
                ce, values, cand_ids = topk_ce(h, head, ce_labels, cfg.num_candidates, cfg.logit_chunk, teacher)
        zero = torch.zeros((), device=ids.device)
        out = {"dflash": decayed_mean(ce, valid, cfg.gamma) if ce is not None else zero, "corr": zero}
        # a shortlist's top-1 is over its rows plus the batch's own labels: optimistic, and not the drafter's argmax,
        # so it is logged under its own name, never as tau_dflash
        out["tau_shortlist" if shortlisted else "tau_dflash"] = _tau(cand_ids[..., 0], target, valid, real)
        if self.corrector is not None:
            with torch.set_grad_enabled(torch.is_grad_enabled() and mode != "drafter"):
                anchor = self.corrector.anchor_transition
                hs = out_block.reshape(N * A, bs, -1) if anchor else h
                hs, vs = (hs, values) if cfg.corr_grad == 1 else (_scale_grad(hs, cfg.corr_grad),
                                                                  _scale_grad(values, cfg.corr_grad))
                anchor_ids = ids.gather(1, anchors).reshape(-1) if anchor else None
                grid = corrector_scores(self.corrector, hs, cand_ids, vs, embed, anchor_ids)
                first, scores = self.corrector.walk_inputs(grid, values)
                out["corr"] = correction_loss(scores, cand_ids, target, valid, cfg.rho, first if anchor else None)
            ranks = select(scores.detach().float(), first.detach().float(), "greedy")
            out["tau_dcoco"] = _tau(cand_ids.gather(2, ranks[..., None])[..., 0], target, valid, real)
        out["loss"] = {"drafter": out["dflash"], "corrector": out["corr"], "joint": out["dflash"] + out["corr"]}[mode]
        out["blocks"] = real.sum()
        return out


    def _head(self, batch: dict[str, torch.Tensor], target: torch.Tensor, valid: torch.Tensor, real: torch.Tensor,
              embed: torch.Tensor, head: torch.Tensor) -> dict[str, torch.Tensor]:
        """A baseline head's own loss (it holds its backbone term: Domino's lam CE(U), DSpark's terms on U plus
        the Markov term), over the drafter's logits U on the whole vocabulary: in joint mode it trains the drafter
        too, as each method's published recipe does. dflash: the DFlash loss of U, logged."""
        cfg, model = self.cfg, self.corrector
        ids, anchors = batch["ids"], batch["anchors"]
        N, A = anchors.shape
        with torch.set_grad_enabled(torch.is_grad_enabled() and cfg.mode == "joint"):
            out_block = self.drafter(ids, batch["hidden"], anchors, embed)
        h = out_block[:, :, 1:].reshape(N * A, -1, out_block.shape[-1])
        U = DFlashDrafter.compute_logits(h, head).float()
        labels = torch.where(valid, target, torch.zeros_like(target))
        anchor_ids = ids.gather(1, anchors).reshape(-1)
        if isinstance(model, DominoHead):
            loss, picks = model.loss(h, U, anchor_ids, labels, valid, embed, curriculum(self.done, 1), cfg.gamma)
        else:
            assert isinstance(model, DSparkHead)
            loss, picks = model.loss(h, U, anchor_ids, labels, valid, gamma=cfg.gamma)
        with torch.no_grad():
            ce = F.cross_entropy(U.flatten(0, 1), labels.reshape(-1), reduction="none").view_as(labels)
        return {"dflash": decayed_mean(ce, valid, cfg.gamma), "corr": loss, "loss": loss, "blocks": real.sum(),
                "tau_dflash": _tau(U.detach().argmax(-1), target, valid, real),
                "tau_head": _tau(picks, target, valid, real)}


def _scale_grad(x: torch.Tensor, w: float) -> torch.Tensor:
    """x in the forward; w x its gradient in the backward."""
    return x.detach() if w == 0 else x.detach() + w * (x - x.detach())


def _tau(sel: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Sum over real blocks of 1 + the leading run of slots whose selected token is the (valid) label."""
    run = ((sel == target) & valid).long().cumprod(-1).sum(-1)
    return ((run + 1) * real).sum().float()
