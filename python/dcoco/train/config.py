"""TrainConfig: the settings of a training run, checked when it is made."""

from __future__ import annotations

import dataclasses
import math

MODES = ("drafter", "corrector", "joint")
# what a resumed run must share with the saved one, or the trajectory would silently change (the global batch,
# seqs_per_step x world size, is checked too: the world size itself may change)
RESUME_KEYS = ("mode", "seed", "anchors", "grad_accum", "eval_sequences", "lr", "warmup", "clip", "gamma", "rho",
               "corr_grad", "num_candidates", "width", "mlp_hidden", "loss_vocab")
SAVE_DTYPES = ("bfloat16", "float16", "float32")


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
