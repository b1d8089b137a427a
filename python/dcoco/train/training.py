"""Training on a cached corpus (corpus.py): a DFlash drafter (mode "drafter"), a DCOCO corrector on a frozen
drafter ("corrector"), or both jointly ("joint": DFlash loss + L_corr). DDP under torchrun, only rank 0
writes; resumable; deterministic given the seed."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import json
import math
import os
import random
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from ..modeling import checkpoint
from ..target.corpus import Corpus
from .online import TargetFeatures, TokenCorpus
from ..corrector import Corrector
from ..modeling.dflash import DFlashConfig, DFlashDrafter, decayed_mean
from ..modeling.head import shortlist_ce, topk_ce
from ..loss import correction_loss
from ..ops.select import select

MODES = ("drafter", "corrector", "joint")
STATE = "train_state.pt"
# what a resumed run must share with the saved one, or the trajectory would silently change (the global batch,
# seqs_per_step x world size, is checked too: the world size itself may change)
RESUME_KEYS = ("mode", "seed", "anchors", "grad_accum", "eval_sequences", "lr", "warmup", "clip", "gamma", "rho",
               "corr_grad", "num_candidates", "width", "mlp_hidden", "loss_vocab")
SAVE_DTYPES = ("bfloat16", "float16", "float32")
RUN_FILES = (STATE, "config.json", "model.safetensors", "log.jsonl", "eval.jsonl")  # what a run leaves in its out


def corrector_scores(corrector: Corrector, hidden: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
                     embed: torch.Tensor) -> torch.Tensor:
    """Corrector scores (R,B-1,K,K) with autograd: every training path goes through here, i.e. through the
    backend picked for the device (backend.py): dcoco::score and its compiled backward, or the native path."""
    return corrector.score(hidden, cand_ids, cand_logits, embed)


@dataclasses.dataclass
class TrainConfig:
    mode: str = "joint"
    out: str = "runs/dcoco"
    epochs: int = 1
    steps: int | None = None        # schedule length; default epochs x steps per epoch
    stop_at: int | None = None      # stop (resumably) after this global step; the schedule is unchanged
    max_time: float | None = None   # stop (resumably) after this many seconds of this session
    seqs_per_step: int = 2          # sequences per micro-batch per rank
    grad_accum: int = 1             # micro-batches per optimizer step
    anchors: int | None = None      # anchors per sequence, at most; None: 512 on CUDA, 32 on a CPU (minutes per epoch)
    lr: float = 6e-4
    warmup: float = 0.04
    clip: float = 1.0
    gamma: float = 7.0              # DFlash loss decay
    rho: float = 4.0                # L_corr decay
    corr_grad: float = 1.0          # joint: weight of L_corr's gradient into the drafter (0: only the DFlash loss
                                    # trains the drafter, the corrector learns on it as it moves; 1: the paper's sum)
    num_candidates: int = 16
    width: int = 128
    mlp_hidden: int = 256
    logit_chunk: int | None = None  # rows per LM-head chunk (head.py); None: 256 MB of float32 logits
    loss_vocab: int | None = None   # drafter mode: the DFlash loss over the corpus's loss_vocab most frequent
                                    # response tokens plus the batch's labels (head.shortlist_ce); None: all V rows
    grad_checkpoint: bool = False   # recompute the drafter's layer activations in backward (less memory, ~1/3 more)
    save_dtype: str = "bfloat16"    # the serving checkpoint's dtype (train_state.pt keeps float32)
    dist_timeout: float = 120.0     # minutes a collective may wait (torchrun), e.g. for a long save or eval
    seed: int = 0
    save_every: int = 200
    log_every: int = 10
    eval_sequences: int = 0         # corpus sequences held out of training; teacher-forced tau on them is logged
    eval_every: int | None = None   # steps between held-out evaluations (default: save_every)
    resume: bool = False            # continue the run saved in out (its configuration must match)
    overwrite: bool = False         # replace a run already in out; without resume or overwrite such an out is refused
    device: str = "auto"            # auto: cuda:LOCAL_RANK when CUDA is available, else cpu

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {self.mode!r}")
        for f in ("epochs", "seqs_per_step", "grad_accum", "num_candidates", "width", "mlp_hidden", "save_every",
                  "log_every"):
            _positive_int(f, getattr(self, f))
        for f in ("steps", "stop_at", "anchors", "logit_chunk", "eval_every", "loss_vocab"):
            if getattr(self, f) is not None:
                _positive_int(f, getattr(self, f))
        if isinstance(self.eval_sequences, bool) or not isinstance(self.eval_sequences, int) or self.eval_sequences < 0:
            raise ValueError(f"eval_sequences: expected an integer >= 0, got {self.eval_sequences!r}")
        if self.loss_vocab is not None and self.mode != "drafter":
            raise ValueError(f"loss_vocab: a shortlisted DFlash loss is for mode 'drafter' (the corrector needs the "
                             f"full head's top-K), got mode {self.mode!r}")
        for f in ("resume", "overwrite"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"{f}: expected True or False, got {getattr(self, f)!r}")
        if self.resume and self.overwrite:
            raise ValueError("resume, overwrite: pick one (continue the run in out, or replace it)")
        if not isinstance(self.grad_checkpoint, bool):
            raise ValueError(f"grad_checkpoint: expected True or False, got {self.grad_checkpoint!r}")
        if self.save_dtype not in SAVE_DTYPES:
            raise ValueError(f"save_dtype: expected one of {SAVE_DTYPES}, got {self.save_dtype!r}")
        for f, lo in (("lr", 0.0), ("clip", 0.0), ("gamma", 0.0), ("rho", 0.0), ("max_time", 0.0),
                      ("dist_timeout", 0.0)):
            v = getattr(self, f)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > lo):
                raise ValueError(f"{f}: expected a finite number > {lo}, got {v!r}")
        if isinstance(self.corr_grad, bool) or not (isinstance(self.corr_grad, (int, float)) and
                                                        0 <= self.corr_grad <= 1):
            raise ValueError(f"corr_grad: expected a weight in [0, 1], got {self.corr_grad!r}")
        if not (isinstance(self.warmup, (int, float)) and 0 <= self.warmup < 1):
            raise ValueError(f"warmup: expected a fraction in [0, 1), got {self.warmup!r}")


def _positive_int(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")


# ---- data: anchors and batches ----

def anchor_positions(response: torch.Tensor) -> torch.Tensor:
    """Positions p with p and p+1 inside the response: the anchor is a committed response token and slot 1
    is supervised."""
    return (response[:-1] & response[1:]).nonzero()[:, 0]


def sample_anchors(response: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
    """Up to count distinct anchor positions, sorted."""
    cand = anchor_positions(response)
    return cand[torch.randperm(len(cand), generator=gen)[:count]].sort().values


def collate(seqs: list[dict[str, torch.Tensor]], anchors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Right-pads sequences (ids, response and, from a feature cache, hidden and labels) to the longest and anchor
    lists to the most; anchor_ok marks the real anchors."""
    N, S, A = len(seqs), max(len(s["ids"]) for s in seqs), max(len(a) for a in anchors)
    b = {k: v.new_zeros(N, S, *v.shape[1:]) for k, v in seqs[0].items()}
    b["anchors"] = torch.zeros(N, A, dtype=torch.long)
    b["anchor_ok"] = torch.zeros(N, A, dtype=torch.bool)
    for i, (s, a) in enumerate(zip(seqs, anchors)):
        for k, v in s.items():
            b[k][i, :len(v)] = v
        b["anchors"][i, :len(a)] = a
        b["anchor_ok"][i, :len(a)] = True
    return b


def _gen(*key: int) -> torch.Generator:
    # tuples of ints hash the same in every process (no hash randomisation for ints)
    return torch.Generator().manual_seed(hash(key) & (2 ** 63 - 1))


class Schedule:
    """Which sequences and anchors every (rank, micro-batch) sees: micro-batch k of an epoch is the k-th slice of
    seqs_per_step x world sequences of that epoch's permutation, dealt to the ranks round-robin; anchors depend on
    (seed, epoch, sequence). A function of the seed and the global batch only, so a resumed run sees exactly what
    an uninterrupted one would, on any world size with the same global batch."""

    def __init__(self, corpus: Corpus | TokenCorpus, seed: int, seqs_per_step: int, anchors: int, rank: int, world: int,
                 held_out: int = 0):
        self.corpus, self.seed, self.n, self.anchors, self.rank, self.world = \
            corpus, seed, seqs_per_step, anchors, rank, world
        usable = [i for i in range(len(corpus)) if len(anchor_positions(corpus[i]["response"]))]
        if held_out >= len(usable):
            raise ValueError(f"eval_sequences: {held_out} held out of {len(usable)} usable sequences leaves none to "
                             f"train on")
        pick = set(torch.randperm(len(usable), generator=_gen(seed, -2))[:held_out].tolist())
        self.held_out = [u for j, u in enumerate(usable) if j in pick]  # a function of the seed only
        self.usable = [u for j, u in enumerate(usable) if j not in pick]
        self.steps_per_epoch = len(self.usable) // (seqs_per_step * world)
        if self.steps_per_epoch < 1:
            raise ValueError(f"corpus: {len(self.usable)} usable sequences are too few for {world} rank(s) x "
                             f"{seqs_per_step} sequences per step")

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        epoch, k = divmod(step, self.steps_per_epoch)
        order = torch.randperm(len(self.usable), generator=_gen(self.seed, epoch, -1))
        g = self.n * self.world
        mine = order[k * g:(k + 1) * g][self.rank:: self.world].tolist()
        seqs = [self.corpus[self.usable[j]] for j in mine]
        anchors = [sample_anchors(s["response"], self.anchors, _gen(self.seed, epoch, self.usable[j]))
                   for s, j in zip(seqs, mine)]
        return collate(seqs, anchors)

    def eval_batches(self):
        """This rank's share of the held-out sequences, seqs_per_step at a time, with fixed anchors; then None
        until every rank has yielded as often (a sharded target needs every rank in each forward)."""
        mine = self.held_out[self.rank:: self.world]
        for k in range(0, len(mine), self.n):
            seqs = [self.corpus[j] for j in mine[k:k + self.n]]
            yield collate(seqs, [sample_anchors(s["response"], self.anchors, _gen(self.seed, -3, j))
                                 for s, j in zip(seqs, mine[k:k + self.n])])
        most = -(-len(self.held_out[:: self.world]) // self.n)  # rank 0 has the largest share
        yield from [None] * (most - -(-len(mine) // self.n))


# ---- the objective ----

class Objective(nn.Module):
    """Losses and teacher-forced tau for one batch; holds the trained modules (what DDP wraps). Slot j of the
    block at anchor p is supervised by labels[p+j], the verifier's argmax (both losses; on a greedy corpus it
    is the next corpus token), and valid while p+j is inside the sequence's response."""

    def __init__(self, drafter: DFlashDrafter, corrector: Corrector | None, cfg: TrainConfig,
                 vocab: torch.Tensor | None = None):
        super().__init__()
        self.drafter, self.corrector, self.cfg, self.vocab = drafter, corrector, cfg, vocab

    def forward(self, batch: dict[str, torch.Tensor], embed: torch.Tensor,
                head: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg, mode = self.cfg, self.cfg.mode
        ids, anchors, labels = batch["ids"], batch["anchors"], batch["labels"]
        (N, A), S, bs = anchors.shape, ids.shape[1], self.drafter.config.block_size
        pos = anchors[..., None] + torch.arange(1, bs, device=ids.device)                # (N,A,B) slot positions
        at = pos.clamp(max=S - 1).view(N, -1)
        target = labels.gather(1, at).view(N * A, bs - 1)
        real = batch["anchor_ok"].reshape(-1)
        valid = ((pos < S) & batch["response"].gather(1, at).view(N, A, -1)).view(N * A, -1) & real[:, None]

        with torch.set_grad_enabled(torch.is_grad_enabled() and mode != "corrector"):
            h = self.drafter(ids, batch["hidden"], anchors, embed)[:, :, 1:].reshape(N * A, bs - 1, -1)
            labels = torch.where(valid, target, torch.zeros_like(target)) if mode != "corrector" else None
            shortlisted = self.vocab is not None and torch.is_grad_enabled()  # evaluation keeps all V rows
            if shortlisted:
                ce, values, cand_ids = shortlist_ce(h, head, labels, self.vocab, cfg.num_candidates)
            else:
                ce, values, cand_ids = topk_ce(h, head, labels, cfg.num_candidates, cfg.logit_chunk)  # row chunks
        zero = torch.zeros((), device=ids.device)
        out = {"dflash": decayed_mean(ce, valid, cfg.gamma) if ce is not None else zero, "corr": zero}
        # a shortlist's top-1 is over its rows plus the batch's own labels: optimistic, and not the drafter's argmax,
        # so it is logged under its own name, never as tau_dflash
        out["tau_shortlist" if shortlisted else "tau_dflash"] = _tau(cand_ids[..., 0], target, valid, real)
        if self.corrector is not None:
            with torch.set_grad_enabled(torch.is_grad_enabled() and mode != "drafter"):
                hs, vs = (h, values) if cfg.corr_grad == 1 else (_scale_grad(h, cfg.corr_grad),
                                                                 _scale_grad(values, cfg.corr_grad))
                scores = corrector_scores(self.corrector, hs, cand_ids, vs, embed)
                out["corr"] = correction_loss(scores, cand_ids, target, valid, cfg.rho)
            ranks = select(scores.detach().float(), values[:, 0].detach().float(), "greedy")
            out["tau_dcoco"] = _tau(cand_ids.gather(2, ranks[..., None])[..., 0], target, valid, real)
        out["loss"] = {"drafter": out["dflash"], "corrector": out["corr"], "joint": out["dflash"] + out["corr"]}[mode]
        out["blocks"] = real.sum()
        return out


def frequent_tokens(corpus: Corpus | TokenCorpus, n: int) -> torch.Tensor:
    """The n most frequent response tokens of the corpus (fewer if it has fewer), sorted: on the target's own
    greedy corpus, the labels' vocabulary."""
    counts = torch.bincount(corpus.ids[corpus.response])
    return counts.topk(min(n, int((counts > 0).sum()))).indices.sort().values


def _scale_grad(x: torch.Tensor, w: float) -> torch.Tensor:
    """x in the forward; w x its gradient in the backward."""
    return x.detach() if w == 0 else x.detach() + w * (x - x.detach())


def _tau(sel: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Sum over real blocks of 1 + the leading run of slots whose selected token is the (valid) label."""
    run = ((sel == target) & valid).long().cumprod(-1).sum(-1)
    return ((run + 1) * real).sum().float()


# ---- the loop ----

@dataclasses.dataclass
class TrainResult:
    drafter: DFlashDrafter
    corrector: Corrector | None
    step: int
    history: list[dict]   # one record per step of this session: losses, tau, lr (global over ranks), seconds


def init_distributed(timeout_minutes: float = TrainConfig.dist_timeout) -> tuple[int, int]:
    """(rank, world): joins the torchrun group when WORLD_SIZE > 1 (nccl on GPU, gloo on CPU), with collectives
    allowed to wait timeout_minutes (NCCL's own default, 10 minutes, aborts ranks waiting on a long step)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # nccl binds each rank to its GPU
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                timeout=datetime.timedelta(minutes=timeout_minutes))
        # torn down before the interpreter's own shutdown: a gloo group left to C++ static destruction can abort
        # the rank ("terminate called without an active exception", seen in CI once in a few runs)
        atexit.register(_destroy_group)
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    return torch.device(name)


def train(cfg: TrainConfig, corpus: Corpus | TokenCorpus, embed: torch.Tensor, head: torch.Tensor,
          drafter: DFlashDrafter | DFlashConfig, corrector: Corrector | None = None,
          progress: bool = True, target: TargetFeatures | None = None) -> TrainResult:
    """Train per cfg.mode; writes cfg.out/{config.json, model.safetensors} (checkpoint.save), train_state.pt,
    log.jsonl and, with held-out sequences, eval.jsonl (rank 0 only). embed/head: the target's frozen (V,d)
    embedding and LM-head weights.
    drafter: a DFlashDrafter (e.g. checkpoint.load) or a DFlashConfig for a fresh one (seeded). corrector:
    trained in corrector/joint modes (fresh and seeded when None), kept frozen in drafter mode. target: the frozen
    target that computes each batch's features and labels (online.py), needed by a TokenCorpus."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg: expected a TrainConfig, got {type(cfg).__name__}")
    if not isinstance(corpus, (Corpus, TokenCorpus)):
        raise TypeError(f"corpus: expected a dcoco.target.corpus.Corpus or online.TokenCorpus, "
                        f"got {type(corpus).__name__}")
    if (target is None) != isinstance(corpus, Corpus):
        raise ValueError("target: a TokenCorpus needs the target (online features), a feature cache must not have it")
    if cfg.mode == "corrector" and not isinstance(drafter, DFlashDrafter):
        raise ValueError("drafter: corrector mode trains on a frozen, trained drafter; pass a DFlashDrafter")
    rank, world = init_distributed(cfg.dist_timeout)
    dev = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    if isinstance(drafter, DFlashConfig):
        drafter = DFlashDrafter(drafter)
    if not isinstance(drafter, DFlashDrafter):
        raise TypeError(f"drafter: expected a DFlashDrafter or DFlashConfig, got {type(drafter).__name__}")
    d = drafter.config.hidden_size
    if corrector is None and cfg.mode != "drafter":
        corrector = Corrector(d, cfg.num_candidates, cfg.width, cfg.mlp_hidden)
    if corrector is not None and corrector.hidden_size != d:
        raise ValueError(f"corrector: hidden_size {corrector.hidden_size} differs from the drafter's {d}")
    if corrector is not None and corrector.num_candidates != cfg.num_candidates:
        raise ValueError(f"cfg.num_candidates: {cfg.num_candidates}, but the corrector is for "
                         f"K = {corrector.num_candidates}")
    src, width = ("target", target.feature_dim) if target is not None else ("corpus", corpus.feature_dim)
    if width != drafter.fc.in_features:
        raise ValueError(f"{src}: features are {width} wide, the drafter expects "
                         f"{drafter.fc.in_features} ({len(drafter.config.target_layer_ids)} target layers x {d})")
    V = drafter.config.vocab_size
    if cfg.num_candidates > V:
        raise ValueError(f"cfg.num_candidates: {cfg.num_candidates} exceeds the vocabulary ({V})")
    for name, w in (("embed", embed), ("head", head)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or tuple(w.shape) != (V, d):
            got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise ValueError(f"{name}: expected the target's ({V}, {d}) weight, got {got}")
    drafter.float().to(dev)
    drafter.requires_grad_(cfg.mode != "corrector")
    drafter.grad_checkpoint = cfg.grad_checkpoint
    if corrector is not None:
        corrector.float().to(dev)
        corrector.requires_grad_(cfg.mode != "drafter")
    # the LM head only meets bf16-autocast matmuls on CUDA: kept in bf16 there (the online target's own head is
    # then shared, not copied); float32 elsewhere
    embed = embed.detach().float().to(dev)
    head = head.detach().to(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)

    anchors = cfg.anchors or (512 if dev.type == "cuda" else 32)
    sched = Schedule(corpus, cfg.seed, cfg.seqs_per_step, anchors, rank, world, cfg.eval_sequences)
    accum = cfg.grad_accum
    total = cfg.steps or cfg.epochs * sched.steps_per_epoch // accum
    if total < 1:
        raise ValueError(f"grad_accum: {accum} micro-batches per step leave no step in {cfg.epochs} epoch(s) of "
                         f"{sched.steps_per_epoch} micro-batches")
    objective = Objective(drafter, corrector, cfg, None if cfg.loss_vocab is None else
                          frequent_tokens(corpus, cfg.loss_vocab).to(dev))
    params = [p for p in objective.parameters() if p.requires_grad]
    clipped = [g for g in ([p for p in m.parameters() if p.requires_grad] for m in (drafter, corrector)
                           if m is not None) if g]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    warm = int(cfg.warmup * total)
    lr_at = (lambda s: (s + 1) / warm if s < warm else
             0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))))
    lr_sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    out = Path(cfg.out)
    start = _resume(out, cfg, total, world, objective, opt, lr_sched) if cfg.resume else _fresh(out, cfg, rank, world)
    model = objective
    if world > 1:
        model = nn.parallel.DistributedDataParallel(objective, device_ids=[dev.index] if dev.type == "cuda" else None,
                                                    gradient_as_bucket_view=True)  # no second copy of the gradients

    history, t0, step, end = [], time.monotonic(), start, min(total, cfg.stop_at or total)
    saver = Saver()
    bar = tqdm(total=total, initial=start, desc=f"train {cfg.mode}", disable=rank != 0 or not progress)
    while step < end:
        t_step = time.monotonic()
        opt.zero_grad(set_to_none=True)
        parts = []
        for m in range(accum):  # gradients summed over micro-batches; DDP all-reduces after the last only
            batch = _features({k: v.to(dev, non_blocking=True) for k, v in sched.batch(step * accum + m).items()},
                              target)
            with model.no_sync() if world > 1 and m < accum - 1 else contextlib.nullcontext():
                with torch.autocast("cuda", torch.bfloat16, enabled=dev.type == "cuda"):
                    res = model(batch, embed, head)
                (res["loss"] / accum).backward()
            parts.append({k: v.detach() for k, v in res.items()})
        res = {k: sum(p[k] for p in parts) for k in parts[0]}  # losses summed over micro-batches, tau and blocks too
        res.update({k: res[k] / accum for k in ("loss", "dflash", "corr")})
        for group in clipped:  # per module: a fresh corrector's large L_corr gradient must not shrink the drafter's
            torch.nn.utils.clip_grad_norm_(group, cfg.clip)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        lr_sched.step()
        step += 1
        rec = _record(res, step, lr, cfg.max_time is not None and time.monotonic() - t0 > cfg.max_time, world, dev)
        stop = rec.pop("stop")
        rec["seconds"] = time.monotonic() - t_step  # this rank's wall time for the step, features included
        history.append(rec)
        if rank == 0:
            _log(out, rec, bar, history, cfg.log_every)
        if cfg.eval_sequences and (step % (cfg.eval_every or cfg.save_every) == 0 or step == end or stop):
            ev = _evaluate(objective, sched, embed, head, step, world, dev, target)
            if rank == 0:
                _log_eval(out, ev, bar)
        if rank == 0:
            if step % cfg.save_every == 0 or step == end or stop:
                saver.save(out, cfg, step, total, world, objective, opt, lr_sched)
        if stop:
            break
    bar.close()
    saver.wait()
    return TrainResult(drafter, corrector, step, history)


def _record(res: dict, step: int, lr: float, stop: bool, world: int, dev: torch.device) -> dict:
    """Global per-step numbers: losses averaged over ranks, tau over all blocks; stop if any rank stops."""
    tau = "tau_shortlist" if "tau_shortlist" in res else "tau_dflash"
    v = torch.stack([res["loss"].detach().float(), res["dflash"].detach().float(), res["corr"].detach().float(),
                     res[tau], res.get("tau_dcoco", torch.zeros((), device=dev)), res["blocks"].float(),
                     torch.tensor(float(stop), device=dev)])
    if world > 1:
        dist.all_reduce(v)
    loss, dflash, corr, td, tc, blocks, stops = v.tolist()
    rec = {"step": step, "lr": lr, "loss": loss / world, "dflash": dflash / world, "corr": corr / world,
           tau: td / max(blocks, 1), "stop": stops > 0}
    if "tau_dcoco" in res:
        rec["tau_dcoco"] = tc / max(blocks, 1)
    return rec


def _features(batch: dict[str, torch.Tensor], target: TargetFeatures | None) -> dict[str, torch.Tensor]:
    """The batch with the target's features and labels (online), or as it is (cached features)."""
    return batch if target is None else {**batch, **target(batch["ids"])}


@torch.no_grad()
def _evaluate(objective: Objective, sched: Schedule, embed, head, step: int, world: int, dev: torch.device,
              target: TargetFeatures | None) -> dict:
    """Teacher-forced tau and losses on the held-out sequences (every rank its share, summed over ranks)."""
    was = objective.training
    objective.eval()
    v = torch.zeros(5, device=dev)  # loss x blocks, dflash x blocks, tau_dflash, tau_dcoco, blocks
    for b in sched.eval_batches():
        if b is None:
            if target is not None:
                target.idle()
            continue
        with torch.autocast("cuda", torch.bfloat16, enabled=dev.type == "cuda"):
            res = objective(_features({k: t.to(dev) for k, t in b.items()}, target), embed, head)
        n = res["blocks"].float()
        v += torch.stack([res["loss"].float() * n, res["dflash"].float() * n, res["tau_dflash"],
                          res.get("tau_dcoco", torch.zeros((), device=dev)), n])
    objective.train(was)
    if world > 1:
        dist.all_reduce(v)
    loss, dflash, td, tc, n = v.tolist()
    ev = {"step": step, "eval_loss": loss / max(n, 1), "eval_dflash": dflash / max(n, 1),
          "eval_tau_dflash": td / max(n, 1), "eval_blocks": int(n)}
    if objective.corrector is not None:
        ev["eval_tau_dcoco"] = tc / max(n, 1)
    return ev


def _log_eval(out: Path, ev: dict, bar: tqdm) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "eval.jsonl", "a") as f:
        f.write(json.dumps(ev) + "\n")
    bar.write(f"step {ev['step']} held-out: " + " ".join(f"{k[5:]} {v:.4f}" for k, v in ev.items()
                                                         if k.startswith("eval_") and k != "eval_blocks"))


def _log(out: Path, rec: dict, bar: tqdm, history: list[dict], every: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    window = history[-every:]
    mean = {k: sum(r[k] for r in window) / len(window) for k in rec if k not in ("step", "lr")}
    bar.set_postfix({k: f"{v:.3f}" for k, v in mean.items()}, refresh=False)
    bar.update(1)
    if rec["step"] % every == 0:
        bar.write(f"step {rec['step']}: " + " ".join(f"{k} {v:.4f}" for k, v in mean.items()) + f" lr {rec['lr']:.2e}")


class Saver:
    """Checkpoints written in the background: a save copies the state to CPU memory (all the training step waits
    for), then a thread writes the serving checkpoint and train_state.pt, each whole before it replaces the old
    one. One save at a time; wait() before the run returns, and it raises what the thread raised."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, out: Path, cfg: TrainConfig, step: int, total: int, world: int, objective: Objective,
             opt: torch.optim.Optimizer, lr_sched) -> None:
        self.wait()
        drafter = _cpu_module(objective.drafter)
        corrector = _cpu_module(objective.corrector) if objective.corrector is not None else None
        state = {"step": step, "total": total, "world": world, "config": dataclasses.asdict(cfg),
                 "drafter": drafter.state_dict(), "corrector": corrector.state_dict() if corrector else None,
                 "optimizer": _to_cpu(opt.state_dict()), "scheduler": lr_sched.state_dict(),
                 "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                         "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}
        self._thread = threading.Thread(target=self._write, args=(out, step, drafter, corrector, state,
                                                                  getattr(torch, cfg.save_dtype)), daemon=False)
        self._thread.start()

    def _write(self, out: Path, step: int, drafter, corrector, state: dict, dtype: torch.dtype) -> None:
        try:
            tmp = out / f".tmp{step}"
            checkpoint.save(tmp, drafter, corrector, dtype=dtype)
            for f in ("config.json", "model.safetensors"):
                os.replace(tmp / f, out / f)
            torch.save(state, tmp / STATE)
            os.replace(tmp / STATE, out / STATE)
            tmp.rmdir()
        except BaseException as e:  # noqa: BLE001 (re-raised by wait, in the training thread)
            self._error = e

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            raise RuntimeError(f"saving the checkpoint failed: {type(e).__name__}: {e}") from e


def _to_cpu(x):
    """x with every tensor in it (nested dicts, lists, tuples) copied to CPU memory."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    return x


def _cpu_module(m: DFlashDrafter | Corrector) -> DFlashDrafter | Corrector:
    """A CPU copy of a drafter or corrector, built on the meta device (no second copy on the GPU)."""
    with torch.device("meta"):
        copy = DFlashDrafter(m.config) if isinstance(m, DFlashDrafter) else \
            Corrector(m.hidden_size, m.num_candidates, m.width, m.mlp_hidden)
    copy.load_state_dict({k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}, assign=True)
    return copy


def saved_progress(out: str | Path) -> tuple[int, int] | None:
    """(step, total) of the training state saved in out, or None when there is none."""
    path = Path(out) / STATE
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)  # mmap: weights are not read
    return state["step"], state["total"]


def run_files(out: str | Path) -> list[str]:
    """The files of a run in out (RUN_FILES present). ValueError when out exists and is not a folder."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} is a file; expected a folder for the run")
    return [f for f in RUN_FILES if (out / f).exists()]


def _fresh(out: Path, cfg: TrainConfig, rank: int, world: int) -> int:
    """Step 0 of a new run in out: refused when out holds a run, unless cfg.overwrite, which removes it first."""
    held = run_files(out)
    if held and not cfg.overwrite:
        saved = saved_progress(out) if STATE in held else None
        what = f"a run at step {saved[0]} of {saved[1]}" if saved else f"a run's files ({', '.join(held)})"
        raise ValueError(f"out: {out} holds {what}; pass resume (--resume) to continue it"
                         + (" (it has no saved state to resume from)" if saved is None else "")
                         + ", overwrite (--overwrite) to replace it, or another out")
    if held:
        if world > 1:
            dist.barrier()  # every rank has looked before rank 0 removes anything
        if rank == 0:
            for f in held:
                (out / f).unlink()
        if world > 1:
            dist.barrier()
    return 0


def _differences(saved: dict, cfg: TrainConfig, keys) -> list[str]:
    saved = {**dataclasses.asdict(TrainConfig()), **saved}  # keys added since the save take defaults
    return [f"{k} ({saved[k]!r} saved, {getattr(cfg, k)!r} now)" for k in keys if saved[k] != getattr(cfg, k)]


def run_differences(out: str | Path, cfg: TrainConfig) -> list[str]:
    """How the run saved in out differs from cfg in what shapes its trajectory (RESUME_KEYS) or its length
    (epochs, steps); [] when it is the same run. A recipe rerun skips or resumes a stage only then."""
    state = torch.load(Path(out) / STATE, map_location="cpu", weights_only=False, mmap=True)
    return _differences(state["config"], cfg, RESUME_KEYS + ("epochs", "steps"))


def _keep_steps(path: Path, last: int) -> None:
    """Drop the records of a JSONL log after step `last` (rank 0): a resumed run logs those steps again."""
    if path.is_file():
        keep = [line for line in path.read_text().splitlines(keepends=True)
                if line.strip() and json.loads(line).get("step", 0) <= last]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(keep))
        os.replace(tmp, path)


def _resume(out: Path, cfg: TrainConfig, total: int, world: int, objective: Objective, opt, lr_sched) -> int:
    if not (out / STATE).is_file():
        raise ValueError(f"resume: no {STATE} in {out}")
    state = torch.load(out / STATE, map_location="cpu", weights_only=False)
    diff = _differences(state["config"], cfg, RESUME_KEYS)
    saved = {**dataclasses.asdict(TrainConfig()), **state["config"]}
    if state["total"] != total:
        diff.append(f"schedule length ({state['total']} saved, {total} now)")
    saved_batch = saved["seqs_per_step"] * state["world"]
    if saved_batch != cfg.seqs_per_step * world:
        diff.append(f"global batch (seqs_per_step x world size: {saved['seqs_per_step']} x {state['world']} saved, "
                    f"{cfg.seqs_per_step} x {world} now; on {world} rank(s) pass seqs_per_step = "
                    f"{saved_batch / world:g})")
    if (state["corrector"] is None) != (objective.corrector is None):
        diff.append("corrector (present in one run only)")
    if diff:
        raise ValueError(f"resume: the run in {out} differs: {', '.join(diff)}")
    objective.drafter.load_state_dict(state["drafter"])
    if objective.corrector is not None:
        objective.corrector.load_state_dict(state["corrector"])
    opt.load_state_dict(state["optimizer"])
    lr_sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    if not dist.is_initialized() or dist.get_rank() == 0:
        for log in ("log.jsonl", "eval.jsonl"):
            _keep_steps(out / log, state["step"])
    return state["step"]
