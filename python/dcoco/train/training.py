"""Training on a cached corpus (corpus.py): a DFlash drafter (mode "drafter"), a DCOCO corrector on a frozen
drafter ("corrector"), or both jointly ("joint": DFlash loss + L_corr); with cfg.method "domino" or "dspark", that
baseline's head in place of the corrector, on its own objective. DDP under torchrun, only rank 0
writes; resumable; deterministic given the seed. The loop is here; config, batches, objective, distributed and
runs hold its parts."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from ..target.corpus import Corpus
from ..target.features import TargetFeatures, TokenCorpus
from ..corrector import Corrector
from ..modeling.dflash import DFlashConfig, DFlashDrafter
from ..modeling.domino import DominoHead
from ..modeling.dspark import DSparkHead
from .batches import Schedule, collate, frequent_tokens, sample_anchors
from .config import TrainConfig
from .distributed import init_distributed, resolve_device
from .objective import Head, Objective, _tau
from .optim import warmup_cosine
from .runs import RunLock, Saver, fresh, log_eval, log_step, resume, run_differences, run_files, saved_progress

# the names users and tests import from here, wherever they live now
__all__ = ["Objective", "Schedule", "TrainConfig", "TrainResult", "_tau", "collate", "frequent_tokens",
           "init_distributed", "resolve_device", "run_differences", "run_files", "sample_anchors", "saved_progress",
           "train"]


@dataclasses.dataclass
class TrainResult:
    drafter: DFlashDrafter
    corrector: Corrector | Head | None   # DCOCO's corrector, or the head cfg.method names
    step: int
    total: int            # the schedule's length: step < total when the run stopped early (stop_at, max_time)
    history: list[dict]   # one record per step this process ran: losses, tau, lr (global over ranks), seconds


def _start(out: Path, cfg: TrainConfig, total: int, rank: int, world: int, objective: Objective, opt):
    """(first step, LR schedule, restart) of a fresh run or of the one out holds (runs.resume)."""
    def make_schedule(restart: int | None, start: int):
        return warmup_cosine(opt, int(cfg.warmup * total), total, restart, start)

    if cfg.resume:
        return resume(out, cfg, total, world, objective, opt, make_schedule)
    return fresh(out, cfg, rank, world), make_schedule(None, 0), None


def train(cfg: TrainConfig, corpus: Corpus | TokenCorpus, embed: torch.Tensor, head: torch.Tensor,
          drafter: DFlashDrafter | DFlashConfig, corrector: Corrector | Head | None = None,
          progress: bool = True, target: TargetFeatures | None = None) -> TrainResult:
    """Train per cfg.mode; writes cfg.out/{config.json, model.safetensors} (checkpoint.save), train_state.pt,
    log.jsonl and, with held-out sequences, eval.jsonl (rank 0 only). embed/head: the target's frozen (V,d)
    embedding and LM-head weights.
    drafter: a DFlashDrafter (e.g. checkpoint.load) or a DFlashConfig for a fresh one (seeded). corrector:
    trained in corrector/joint modes (fresh and seeded when None; a DominoHead or DSparkHead for cfg.method domino
    or dspark), kept frozen in drafter mode. target: the frozen
    target that computes each batch's features and labels (target/features.py), needed by a TokenCorpus."""
    _check_inputs(cfg, corpus, drafter, target)
    rank, world = init_distributed(cfg.dist_timeout)
    dev = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    drafter, corrector = _modules(cfg, corpus, drafter, corrector, target)
    _check_weights(cfg, drafter, embed, head)
    embed, head = _place(cfg, drafter, corrector, embed, head, dev)

    anchors = cfg.anchors or (512 if dev.type == "cuda" else 32)
    sched = Schedule(corpus, cfg.seed, cfg.seqs_per_step, anchors, rank, world, cfg.eval_sequences)
    total = cfg.steps or cfg.epochs * sched.steps_per_epoch // cfg.grad_accum
    if total < 1:
        raise ValueError(f"grad_accum: {cfg.grad_accum} micro-batches per step leave no step in {cfg.epochs} "
                         f"epoch(s) of {sched.steps_per_epoch} micro-batches")
    objective = Objective(drafter, corrector, cfg, None if cfg.loss_vocab is None else
                          frequent_tokens(corpus, cfg.loss_vocab).to(dev))
    opt = torch.optim.AdamW([p for p in objective.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    out = Path(cfg.out)
    lock = RunLock(out).acquire() if rank == 0 else None  # one writer per run folder
    try:
        start, lr_sched, restart = _start(out, cfg, total, rank, world, objective, opt)
        model: nn.Module = objective
        if world > 1:
            model = nn.parallel.DistributedDataParallel(
                objective, device_ids=[dev.index] if dev.type == "cuda" else None,
                gradient_as_bucket_view=True)  # no second copy of the gradients

        history, t0, step, end = [], time.monotonic(), start, min(total, cfg.stop_at or total)
        saver = Saver()
        if rank == 0 and start >= end and not _serving_loads(out):  # finished: its checkpoint must still load
            saver.save(out, cfg, step, total, world, objective, opt, lr_sched, restart)
        bar = tqdm(total=total, initial=start, desc=f"train {cfg.mode}", disable=rank != 0 or not progress)
        while step < end:
            t_step = time.monotonic()
            objective.done = step / total
            res = _step(model, objective, opt, sched, step, embed, head, dev, target, world)
            lr = opt.param_groups[0]["lr"]
            opt.step()
            lr_sched.step()
            step += 1
            rec = _record(res, step, lr, cfg.max_time is not None and time.monotonic() - t0 > cfg.max_time, world, dev,
                          _second_tau(cfg))
            stop = rec.pop("stop")
            rec["seconds"] = time.monotonic() - t_step  # this rank's wall time for the step, features included
            history.append(rec)
            if rank == 0:
                log_step(out, rec, bar, history, cfg.log_every)
            if cfg.eval_sequences and (step % (cfg.eval_every or cfg.save_every) == 0 or step == end or stop):
                ev = _evaluate(objective, sched, embed, head, step, world, dev, target)
                if rank == 0:
                    log_eval(out, ev, bar)
            if rank == 0:
                if step % cfg.save_every == 0 or step == end or stop:
                    saver.save(out, cfg, step, total, world, objective, opt, lr_sched, restart)
            if stop:
                break
        bar.close()
        saver.wait()
    finally:
        if lock is not None:
            lock.release()
    return TrainResult(drafter, corrector, step, total, history)


def _place(cfg: TrainConfig, drafter: DFlashDrafter, corrector: Corrector | Head | None, embed: torch.Tensor,
           head: torch.Tensor, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Moves the trained modules to dev in float32 with gradients where cfg.mode trains them; returns the
    target's embedding and LM head on dev."""
    drafter.float().to(dev)
    drafter.requires_grad_(cfg.mode != "corrector")
    drafter.grad_checkpoint = cfg.grad_checkpoint
    if corrector is not None:
        corrector.float().to(dev)
        corrector.requires_grad_(cfg.mode != "drafter")
    # the LM head only meets bf16-autocast matmuls on CUDA: kept in bf16 there (the online target's own head is
    # then shared, not copied); float32 elsewhere
    return (embed.detach().float().to(dev),
            head.detach().to(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32))


def _serving_loads(out: Path) -> bool:
    """Whether the serving checkpoint in out loads; warns naming what is wrong when it does not (a resumed,
    finished run then writes it again from train_state.pt)."""
    from ..modeling import checkpoint

    try:
        checkpoint.load(out)
    except ValueError as e:
        warnings.warn(f"{e}; writing {out}'s serving checkpoint again from its train_state.pt", stacklevel=3)
        return False
    return True


def _check_inputs(cfg, corpus, drafter, target) -> None:
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg: expected a TrainConfig, got {type(cfg).__name__}")
    if not isinstance(corpus, (Corpus, TokenCorpus)):
        raise TypeError(f"corpus: expected a dcoco.target.corpus.Corpus or dcoco.target.features.TokenCorpus, "
                        f"got {type(corpus).__name__}")
    if (target is None) != isinstance(corpus, Corpus):
        raise ValueError("target: a TokenCorpus needs the target (online features), a feature cache must not have it")
    if cfg.distill is not None and (target is None or target.teacher != cfg.distill):
        raise ValueError(f"distill: {cfg.distill} needs online features whose target gives its top-{cfg.distill} "
                         f"distribution (TargetFeatures(..., teacher={cfg.distill})), got "
                         f"{'a feature cache' if target is None else f'teacher={target.teacher}'}")
    if cfg.mode == "corrector" and not isinstance(drafter, DFlashDrafter):
        raise ValueError("drafter: corrector mode trains on a frozen, trained drafter; pass a DFlashDrafter")


def _modules(cfg: TrainConfig, corpus, drafter, corrector,
             target) -> tuple[DFlashDrafter, Corrector | Head | None]:
    """The drafter (a fresh one for a DFlashConfig) and the corrector or head (a fresh one when a mode trains it
    and none is given), checked against each other, cfg and the features."""
    if isinstance(drafter, DFlashConfig):
        drafter = DFlashDrafter(drafter)
    if not isinstance(drafter, DFlashDrafter):
        raise TypeError(f"drafter: expected a DFlashDrafter or DFlashConfig, got {type(drafter).__name__}")
    d, V = drafter.config.hidden_size, drafter.config.vocab_size
    kind: type[Corrector | Head]
    kind, make = {"dcoco": (Corrector, lambda: Corrector(d, cfg.num_candidates, cfg.width, cfg.mlp_hidden,
                                                         cfg.anchor_transition)),
                  "domino": (DominoHead, lambda: DominoHead(d, d, V)),
                  "dspark": (DSparkHead, lambda: DSparkHead(d, V))}[cfg.method]
    if corrector is None and cfg.mode != "drafter":
        corrector = make()
    if corrector is not None and not isinstance(corrector, kind):
        raise ValueError(f"corrector: method {cfg.method!r} trains a {kind.__name__}, got a "
                         f"{type(corrector).__name__} (from --init?)")
    if isinstance(corrector, (DominoHead, DSparkHead)):
        if (corrector.hidden_size, corrector.vocab_size) != (d, V):
            raise ValueError(f"corrector: a {type(corrector).__name__} for hidden_size {corrector.hidden_size} and "
                             f"vocab_size {corrector.vocab_size}; the drafter has {d} and {V}")
    elif isinstance(corrector, Corrector):
        if corrector.hidden_size != d:
            raise ValueError(f"corrector: hidden_size {corrector.hidden_size} differs from the drafter's {d}")
        if corrector.anchor_transition != cfg.anchor_transition:
            raise ValueError(f"cfg.anchor_transition: {cfg.anchor_transition}, but the corrector has "
                             f"anchor_transition={corrector.anchor_transition}")
        if corrector.num_candidates != cfg.num_candidates:
            raise ValueError(f"cfg.num_candidates: {cfg.num_candidates}, but the corrector is for "
                             f"K = {corrector.num_candidates}")
    src, width = ("target", target.feature_dim) if target is not None else ("corpus", corpus.feature_dim)
    if width != drafter.fc.in_features:
        raise ValueError(f"{src}: features are {width} wide, the drafter expects "
                         f"{drafter.fc.in_features} ({len(drafter.config.target_layer_ids)} target layers x {d})")
    return drafter, corrector


def _check_weights(cfg: TrainConfig, drafter: DFlashDrafter, embed, head) -> None:
    V, d = drafter.config.vocab_size, drafter.config.hidden_size
    if cfg.num_candidates > V:
        raise ValueError(f"cfg.num_candidates: {cfg.num_candidates} exceeds the vocabulary ({V})")
    for name, w in (("embed", embed), ("head", head)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or tuple(w.shape) != (V, d):
            got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise ValueError(f"{name}: expected the target's ({V}, {d}) weight, got {got}")


def _step(model: nn.Module, objective: Objective, opt: torch.optim.Optimizer, sched: Schedule, step: int, embed, head,
          dev: torch.device, target: TargetFeatures | None, world: int) -> dict[str, torch.Tensor]:
    """One optimizer step's gradients, clipped: the losses summed over its micro-batches (loss, dflash and corr
    then averaged), tau and blocks summed."""
    accum = objective.cfg.grad_accum
    opt.zero_grad(set_to_none=True)
    parts = []
    for m in range(accum):  # gradients summed over micro-batches; DDP all-reduces after the last only
        batch = _features({k: v.to(dev, non_blocking=True) for k, v in sched.batch(step * accum + m).items()}, target)
        ddp = cast(nn.parallel.DistributedDataParallel, model)  # what model is when world > 1
        with ddp.no_sync() if world > 1 and m < accum - 1 else contextlib.nullcontext():
            with torch.autocast("cuda", torch.bfloat16, enabled=dev.type == "cuda"):
                res = model(batch, embed, head)
            (res["loss"] / accum).backward()
        parts.append({k: v.detach() for k, v in res.items()})
    res = {k: sum(p[k] for p in parts) for k in parts[0]}
    res.update({k: res[k] / accum for k in ("loss", "dflash", "corr")})
    # per module: a fresh corrector's large L_corr gradient must not shrink the drafter's
    for module in (objective.drafter, objective.corrector):
        group = [p for p in module.parameters() if p.requires_grad] if module is not None else []
        if group:
            torch.nn.utils.clip_grad_norm_(group, objective.cfg.clip)
    return res


def _record(res: dict, step: int, lr: float, stop: bool, world: int, dev: torch.device, second: str) -> dict:
    """Global per-step numbers: losses averaged over ranks, tau over all blocks (second: the re-selected draft's,
    _second_tau); stop if any rank stops."""
    tau = "tau_shortlist" if "tau_shortlist" in res else "tau_dflash"
    v = torch.stack([res["loss"].detach().float(), res["dflash"].detach().float(), res["corr"].detach().float(),
                     res[tau], res.get(second, torch.zeros((), device=dev)), res["blocks"].float(),
                     torch.tensor(float(stop), device=dev)])
    if world > 1:
        dist.all_reduce(v)
    loss, dflash, corr, td, tc, blocks, stops = v.tolist()
    rec = {"step": step, "lr": lr, "loss": loss / world, "dflash": dflash / world, "corr": corr / world,
           tau: td / max(blocks, 1), "stop": stops > 0}
    if second in res:
        rec[second] = tc / max(blocks, 1)
    return rec


def _second_tau(cfg: TrainConfig) -> str:
    """The key of the re-selected draft's tau (Objective's outputs; absent in drafter mode): tau_head for a
    baseline's head, tau_dcoco for DCOCO's corrector."""
    return "tau_dcoco" if cfg.method == "dcoco" else "tau_head"


def _features(batch: dict[str, torch.Tensor], target: TargetFeatures | None) -> dict[str, torch.Tensor]:
    """The batch with the target's features and labels (online), or as it is (cached features)."""
    return batch if target is None else {**batch, **target(batch["ids"])}


@torch.no_grad()
def _evaluate(objective: Objective, sched: Schedule, embed, head, step: int, world: int, dev: torch.device,
              target: TargetFeatures | None) -> dict:
    """Teacher-forced tau and losses on the held-out sequences (every rank its share, summed over ranks)."""
    was, second = objective.training, _second_tau(objective.cfg)
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
                          res.get(second, torch.zeros((), device=dev)), n])
    objective.train(was)
    if world > 1:
        dist.all_reduce(v)
    loss, dflash, td, tc, n = v.tolist()
    ev = {"step": step, "eval_loss": loss / max(n, 1), "eval_dflash": dflash / max(n, 1),
          "eval_tau_dflash": td / max(n, 1), "eval_blocks": int(n)}
    if objective.corrector is not None:
        ev[f"eval_{second}"] = tc / max(n, 1)
    return ev
