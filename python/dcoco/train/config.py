"""TrainConfig: the settings of a training run, checked when it is made."""

from __future__ import annotations

import dataclasses
import math

MODES = ("drafter", "corrector", "joint")
METHODS = ("dcoco", "domino", "dspark")
SAVE_DTYPES = ("bfloat16", "float16", "float32")


def _field(default, group: str | None = None, help: str | None = None, flag: str | None = None,
           choices: tuple | None = None, stage: bool = False, resume: bool = False):
    """A TrainConfig field with what `dcoco train` needs to know of it: its option group (None: no option), help
    text, flag when not the field's name and choices; whether a recipe's [[stages]] may set it (stage) and whether
    a resumed run must share it with the saved one (resume)."""
    return dataclasses.field(default=default, metadata={"group": group, "help": help, "flag": flag,
                                                        "choices": choices, "stage": stage, "resume": resume})


WHAT, OPTIM, MEMORY = "what to train", "optimisation", "memory and runs"


@dataclasses.dataclass
class TrainConfig:
    mode: str = _field("joint", WHAT, "drafter: DFlash loss; corrector: L_corr on a frozen drafter (needs --init); "
                                      "joint: both (default: %(default)s)", choices=MODES, stage=True, resume=True)
    method: str = _field("dcoco", WHAT, "what re-selects the draft in corrector and joint modes: dcoco (the "
                                        "corrector, L_corr), or the paper's baselines' heads with their own "
                                        "objectives: domino (its base-anchored curriculum over the run), dspark "
                                        "(its CE + L1 + confidence loss) (default: %(default)s)", choices=METHODS,
                         stage=True, resume=True)
    out: str = _field("runs/dcoco", WHAT, "checkpoint directory: serving layout, train_state.pt, log.jsonl (default: "
                                          "%(default)s)", stage=True)
    epochs: int = _field(1, OPTIM, "(%(default)s)", stage=True)
    steps: int | None = _field(None, OPTIM, "schedule length (default: epochs x steps per epoch)", stage=True)
    stop_at: int | None = _field(None, OPTIM, "stop after this global step (resumable; schedule unchanged)",
                                 stage=True)
    max_time: float | None = _field(None, OPTIM, "stop after this many seconds (resumable; schedule unchanged)",
                                    stage=True)  # this process's seconds
    seqs_per_step: int = _field(2, OPTIM, "sequences per micro-batch per rank (%(default)s)", stage=True)
    grad_accum: int = _field(1, OPTIM, "micro-batches per optimizer step (%(default)s)", stage=True, resume=True)
    anchors: int | None = _field(None, OPTIM, "anchors per sequence, at most (default: 512 on CUDA, 32 on a CPU)",
                                 stage=True, resume=True)  # a CPU's 32: minutes per epoch
    lr: float = _field(6e-4, OPTIM, "AdamW, cosine schedule (%(default)s)", stage=True, resume=True)
    warmup: float = _field(0.04, OPTIM, "warmup fraction (%(default)s)", stage=True, resume=True)
    clip: float = _field(1.0, resume=True)
    gamma: float = _field(7.0, OPTIM, "DFlash loss decay: slot k weighs exp(-(k-1)/gamma) (%(default)s)",
                          stage=True, resume=True)
    rho: float = _field(4.0, OPTIM, "L_corr decay: transition p weighs exp(-(p-1)/rho) (%(default)s)",
                        stage=True, resume=True)
    num_candidates: int = _field(16, OPTIM, "K (%(default)s)", flag="candidates", resume=True)
    width: int = _field(128, OPTIM, "corrector width r (%(default)s)", resume=True)
    mlp_hidden: int = _field(256, OPTIM, "corrector MLP width (%(default)s)", resume=True)
    corr_grad: float = _field(1.0, OPTIM, "joint: weight of L_corr's gradient into the drafter; 0 trains the drafter "
                                          "on the DFlash loss alone while the corrector learns on it (%(default)s: "
                                          "the paper's sum)", stage=True, resume=True)
    anchor_transition: bool = _field(False, OPTIM, "the corrector also re-ranks slot 1, scoring its candidates "
                                                   "against the anchor (beyond the paper: docs/spec.md, the anchor "
                                                   "transition)", stage=True, resume=True)
    logit_chunk: int | None = _field(None, MEMORY, "rows per LM-head chunk for the loss and top-K (default: 256 MB "
                                                   "of float32 logits per chunk)")  # head.py
    # drafter and joint modes: head.shortlist_ce (joint: head.whole_head_topk for the corrector)
    loss_vocab: int | None = _field(None, OPTIM, "drafter and joint modes: the DFlash loss over the corpus's N most "
                                                 "frequent response tokens plus each batch's labels instead of the "
                                                 "whole vocabulary (a cheaper step; the corrector still re-selects "
                                                 "among the whole head's top-K; default: all of it)", stage=True,
                        resume=True)
    distill: int | None = _field(None, OPTIM, "the DFlash loss as distillation: cross-entropy against the target's "
                                              "next-token distribution over its top N tokens (renormalised) instead "
                                              "of its argmax alone; needs online features, whose target pass then "
                                              "runs to its head (default: the argmax)", stage=True, resume=True)
    grad_checkpoint: bool = _field(False, MEMORY, "recompute the drafter layers' activations in backward: less "
                                                  "memory, about 1/3 more compute")
    save_dtype: str = _field("bfloat16", MEMORY, "the serving checkpoint's dtype; train_state.pt keeps float32 "
                                                 "(%(default)s)", choices=SAVE_DTYPES)
    dist_timeout: float = _field(120.0, MEMORY, "minutes a torchrun collective may wait (%(default)s)")
    seed: int = _field(0, OPTIM, "(%(default)s)", resume=True)
    save_every: int = _field(200, OPTIM, "steps between checkpoints (%(default)s)", stage=True)
    log_every: int = _field(10, OPTIM, "steps per printed summary (%(default)s)")
    eval_sequences: int = _field(0, OPTIM, "corpus sequences held out; their teacher-forced tau goes to eval.jsonl "
                                           "(%(default)s)", stage=True, resume=True)
    eval_every: int | None = _field(None, OPTIM, "steps between held-out evaluations (default: --save-every)",
                                    stage=True)
    resume: bool = _field(False, WHAT, "continue the run saved in --out (its settings must match)")
    overwrite: bool = _field(False, WHAT, "replace a run already in --out (without --resume or --overwrite such an "
                                          "--out is refused)")
    device: str = _field("auto", OPTIM, "auto: cuda:LOCAL_RANK when available, else cpu")

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {self.mode!r}")
        for f in ("epochs", "seqs_per_step", "grad_accum", "num_candidates", "width", "mlp_hidden", "save_every",
                  "log_every"):
            _positive_int(f, getattr(self, f))
        for f in ("steps", "stop_at", "anchors", "logit_chunk", "eval_every", "loss_vocab", "distill"):
            if getattr(self, f) is not None:
                _positive_int(f, getattr(self, f))
        if isinstance(self.eval_sequences, bool) or not isinstance(self.eval_sequences, int) or self.eval_sequences < 0:
            raise ValueError(f"eval_sequences: expected an integer >= 0, got {self.eval_sequences!r}")
        if self.method not in METHODS:
            raise ValueError(f"method: expected one of {METHODS}, got {self.method!r}")
        if self.method != "dcoco" and self.mode == "drafter":
            raise ValueError(f"method: {self.method!r} trains a head beside the drafter; mode 'drafter' trains the "
                             f"drafter alone (pick mode 'corrector' or 'joint', or method 'dcoco')")
        if self.method != "dcoco" and self.anchor_transition:
            raise ValueError(f"anchor_transition: DCOCO's corrector only, got method {self.method!r}")
        for f, what in (("loss_vocab", "shortlists"), ("distill", "changes")):  # settings of the DFlash loss alone
            if getattr(self, f) is not None and (self.mode == "corrector" or self.method != "dcoco"):
                raise ValueError(f"{f}: {what} the DFlash loss, which mode {self.mode!r} with method "
                                 f"{self.method!r} does not train (use mode 'drafter' or 'joint' with method 'dcoco')")
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


# what a resumed run must share with the saved one, or the trajectory would silently change (the global batch,
# seqs_per_step x world size, is checked too: the world size itself may change)
RESUME_KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.metadata["resume"])
