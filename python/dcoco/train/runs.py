"""A run's folder: its logs, background checkpoint saves, and starting fresh or resuming."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import random
import shutil
import threading
from pathlib import Path
from collections.abc import Callable
from typing import IO

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from tqdm import tqdm

from ..files import write_text_atomic
from ..jsonl import BadLine, read_lines
from ..modeling import checkpoint
from ..corrector import Corrector
from ..modeling.dflash import DFlashDrafter
from ..modeling.domino import DominoHead
from ..modeling.dspark import DSparkHead
from .config import RESUME_KEYS, TrainConfig
from .stages import DONE
from .objective import Objective

STATE = "train_state.pt"
STATE_KEYS = ("step", "total", "world", "config", "drafter", "corrector", "optimizer", "scheduler", "rng")
# beside the serving checkpoint, small enough to keep with the weights where train_state.pt is not kept: the step,
# schedule and settings the weights were saved at, and their sha256 (a save cut between the two files shows)
PROGRESS = "progress.json"
PROGRESS_KEYS = ("step", "total", "world", "config", "restart", "weights_sha256")
SAVING = ".tmp"  # + step: a save in progress inside the run folder
RUN_FILES = (STATE, PROGRESS, "config.json", "model.safetensors", "log.jsonl", "eval.jsonl", DONE)  # what a run leaves


def log_eval(out: Path, ev: dict, bar: tqdm) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "eval.jsonl", "a") as f:
        f.write(json.dumps(ev) + "\n")
    bar.write(f"step {ev['step']} held-out: " + " ".join(f"{k[5:]} {v:.4f}" for k, v in ev.items()
                                                         if k.startswith("eval_") and k != "eval_blocks"))


def log_step(out: Path, rec: dict, bar: tqdm, history: list[dict], every: int) -> None:
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
             opt: torch.optim.Optimizer, lr_sched, restart: int | None = None) -> None:
        self.wait()
        drafter = _cpu_module(objective.drafter)
        corrector = _cpu_module(objective.corrector) if objective.corrector is not None else None
        state = {"step": step, "total": total, "world": world, "config": dataclasses.asdict(cfg),
                 "drafter": drafter.state_dict(), "corrector": corrector.state_dict() if corrector else None,
                 "optimizer": _to_cpu(opt.state_dict()), "scheduler": lr_sched.state_dict(),
                 "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                         "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                 "restart": restart}
        self._thread = threading.Thread(target=self._write, args=(out, step, drafter, corrector, state,
                                                                  getattr(torch, cfg.save_dtype)), daemon=False)
        self._thread.start()

    def _write(self, out: Path, step: int, drafter, corrector, state: dict, dtype: torch.dtype) -> None:
        try:
            tmp = out / f"{SAVING}{step}"
            checkpoint.save(tmp, drafter, corrector, dtype=dtype)  # written whole and fsynced
            progress = {k: state[k] for k in PROGRESS_KEYS[:-1]}
            write_text_atomic(tmp / PROGRESS, json.dumps({**progress, "weights_sha256": _sha256(
                tmp / "model.safetensors")}, indent=1) + "\n")
            # one file at a time into the run folder (it holds the logs too): every save of a run writes the
            # same config.json, so a reader between the renames still finds a matching pair, and progress.json
            # names the weights it describes
            for name in ("model.safetensors", "config.json", PROGRESS):
                os.replace(tmp / name, out / name)
            with open(tmp / STATE, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
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


def _cpu_module(m: nn.Module) -> nn.Module:
    """A CPU copy of a drafter, corrector or head, built on the meta device (no second copy on the GPU)."""
    with torch.device("meta"):
        if isinstance(m, DFlashDrafter):
            copy: nn.Module = DFlashDrafter(m.config)
        elif isinstance(m, DominoHead):
            copy = DominoHead(m.hidden_size, m.embed_size, m.vocab_size, m.gru_size, m.mid_size)
        elif isinstance(m, DSparkHead):
            copy = DSparkHead(m.hidden_size, m.vocab_size, m.rank)
        else:
            assert isinstance(m, Corrector)
            copy = Corrector(m.hidden_size, m.num_candidates, m.width, m.mlp_hidden, m.anchor_transition)
    copy.load_state_dict({k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}, assign=True)
    return copy


def saved_run(out: str | Path) -> dict | None:
    """The record of the run saved in out (step, total, world, config, ...): its train_state.pt (mmap: the weights
    are not read), else its progress.json; None with neither."""
    if (Path(out) / STATE).is_file():
        return read_state(Path(out), mmap=True)
    return read_progress(out)


def saved_progress(out: str | Path) -> tuple[int, int] | None:
    """(step, total) of the run saved in out (saved_run), or None."""
    run = saved_run(out)
    return None if run is None else (run["step"], run["total"])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_progress(out: str | Path) -> dict | None:
    """out's progress.json when it describes out's model.safetensors, None without one; ValueError naming the
    file when it is unreadable or describes other weights (a save cut between its renames)."""
    path = Path(out) / PROGRESS
    if not path.is_file():
        return None
    try:
        progress = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not readable ({type(e).__name__}: {e}); pass overwrite (--overwrite) to train "
                         f"from the start") from None
    missing = [k for k in PROGRESS_KEYS if not isinstance(progress, dict) or k not in progress]
    if missing:
        raise ValueError(f"{path}: not a training progress record (no {', '.join(missing)})")
    weights = Path(out) / "model.safetensors"
    if not weights.is_file() or _sha256(weights) != progress["weights_sha256"]:
        raise ValueError(f"{path}: describes other weights than {weights} (a save cut short); resume from "
                         f"{STATE} if it is there, or pass overwrite (--overwrite)")
    return progress


def logged_steps(out: str | Path) -> int:
    """The last step in out/log.jsonl (0 without one)."""
    path = Path(out) / "log.jsonl"
    if not path.is_file():
        return 0
    rows = [row for _, row in read_lines(path.read_text(), appended=True) if isinstance(row, dict)]
    return max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=0)


def read_state(out: Path, mmap: bool = False) -> dict:
    """out's train_state.pt; ValueError naming the file when it is missing, cut short or not a training state."""
    path = out / STATE
    if not path.is_file():
        raise ValueError(f"resume: no {STATE} in {out}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except Exception as e:  # noqa: BLE001 (torch.load's errors for a bad file are of many types)
        raise ValueError(f"{path}: not a readable training state ({type(e).__name__}: {str(e)[:120]}); pass "
                         f"overwrite (--overwrite) to train from the start") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path}: not a training state (no {', '.join(missing)}); pass overwrite (--overwrite) to "
                         f"train from the start")
    return state


LOCK = ".lock"  # held by the process that writes the run (fcntl.flock; the OS drops it when that process dies)


class RunLock:
    """One writer per run folder: an exclusive advisory lock on out/.lock, held from before the run looks at the
    folder until it has written its last checkpoint. A second run into the folder is refused at once, naming the
    holder's pid; a killed holder never blocks (its lock goes with it)."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self._file: IO[str] | None = None  # the open lock file while held

    def acquire(self) -> RunLock:
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"out: {self.out} is a file; expected a folder for the run")
        self.out.mkdir(parents=True, exist_ok=True)
        f = open(self.out / LOCK, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise ValueError(f"out: {self.out} is in use by another run (pid {holder}); wait for it to end or pass "
                             f"another out") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f
        for stale in self.out.glob(f"{SAVING}*"):  # what a save killed mid-write left (the lock says none runs)
            shutil.rmtree(stale, ignore_errors=True)
        return self

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing drops the lock
            self._file = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def run_files(out: str | Path) -> list[str]:
    """The files of a run in out (RUN_FILES present). ValueError when out exists and is not a folder."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} is a file; expected a folder for the run")
    return [f for f in RUN_FILES if (out / f).exists()]


def fresh(out: Path, cfg: TrainConfig, rank: int, world: int) -> int:
    """Step 0 of a new run in out: refused when out holds a run, unless cfg.overwrite, which removes it first."""
    held = run_files(out)
    if held and not cfg.overwrite:
        saved = saved_progress(out)
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


def run_differences(saved: dict, cfg: TrainConfig) -> list[str]:
    """How a saved run (saved_run's record) differs from cfg in what shapes its trajectory (RESUME_KEYS) or its
    length (epochs, steps); [] when it is the same run. A recipe rerun skips or resumes a stage only then."""
    return _differences(saved["config"], cfg, RESUME_KEYS + ("epochs", "steps"))


def _keep_steps(path: Path, last: int) -> None:
    """Drop the records of a JSONL log after step `last` (rank 0): a resumed run logs those steps again. A last
    line cut by a kill mid-write goes too; any other line that is not a JSON record is a ValueError naming it."""
    if path.is_file():
        keep = []
        try:
            for n, rec in read_lines(path.read_text(encoding="utf-8", errors="replace"), appended=True):
                if not isinstance(rec, dict):
                    raise ValueError(f"{path}: line {n} is not a JSON object; remove it to resume")
                if rec.get("step", 0) <= last:
                    keep.append(json.dumps(rec) + "\n")
        except BadLine as e:
            raise ValueError(f"{path}: line {e.line} is not JSON; remove it to resume") from None
        write_text_atomic(path, "".join(keep))


def _check_same_run(out: Path, saved: dict, cfg: TrainConfig, total: int, world: int, objective: Objective,
                    corrector_saved: bool) -> None:
    diff = _differences(saved["config"], cfg, RESUME_KEYS)
    config = {**dataclasses.asdict(TrainConfig()), **saved["config"]}
    if saved["total"] != total:
        diff.append(f"schedule length ({saved['total']} saved, {total} now)")
    saved_batch = config["seqs_per_step"] * saved["world"]
    if saved_batch != cfg.seqs_per_step * world:
        diff.append(f"global batch (seqs_per_step x world size: {config['seqs_per_step']} x {saved['world']} saved, "
                    f"{cfg.seqs_per_step} x {world} now; on {world} rank(s) pass seqs_per_step = "
                    f"{saved_batch / world:g})")
    if corrector_saved != (objective.corrector is not None):
        diff.append("corrector (present in one run only)")
    if diff:
        raise ValueError(f"resume: the run in {out} differs: {', '.join(diff)}")


def resume(out: Path, cfg: TrainConfig, total: int, world: int, objective: Objective, opt,
           make_schedule: Callable[[int | None, int], LambdaLR]) -> tuple[int, LambdaLR, int | None]:
    """(step, LR schedule, restart) of the run saved in out, its modules loaded. From train_state.pt when out has
    it: the optimizer, schedule and RNG too, exactly where they were. Otherwise from the weights and progress.json
    kept where the optimizer state is not (a repository, a new machine): the optimizer starts fresh at the saved
    step, and the schedule, from there, warms the LR up again over its warm-up length (restart). ValueError when
    out's run differs from cfg in what shapes its trajectory. make_schedule(restart, start) builds the schedule."""
    if not (out / STATE).is_file() and (out / PROGRESS).is_file():
        progress = read_progress(out)
        assert progress is not None
        drafter, corrector = checkpoint.load(out)
        _check_same_run(out, progress, cfg, total, world, objective, corrector is not None)
        objective.drafter.load_state_dict({k: v.float() for k, v in drafter.state_dict().items()})
        if objective.corrector is not None and corrector is not None:
            objective.corrector.load_state_dict({k: v.float() for k, v in corrector.state_dict().items()})
        step = progress["step"]
        lr_sched = make_schedule(step, step)  # restarted at the saved step, and starting there
        _keep_logs(out, step)
        return step, lr_sched, step
    state = read_state(out)
    _check_same_run(out, state, cfg, total, world, objective, state["corrector"] is not None)
    objective.drafter.load_state_dict(state["drafter"])
    if objective.corrector is not None:
        objective.corrector.load_state_dict(state["corrector"])
    restart = state.get("restart")
    lr_sched = make_schedule(restart, 0)  # before the optimizer's state: a new schedule sets the LR to step 0's
    opt.load_state_dict(state["optimizer"])
    lr_sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    _keep_logs(out, state["step"])
    return state["step"], lr_sched, restart


def _keep_logs(out: Path, step: int) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        for log in ("log.jsonl", "eval.jsonl"):
            _keep_steps(out / log, step)
