"""Finished stages and what they depend on: one mechanism for a recipe's stages (`dcoco train --config`) and the
demo's cached stages (dcoco.experiments).

When a stage finishes, its folder gets done.json: its recipe (the settings its result depends on and the recipe
of the stage it started from, so a chain of stages carries its whole lineage) beside what it measured. A later
run finds the stage done when done.json holds the recipe it would write. When it holds another one, the demo,
which owns its cache, trains the stage again, and a recipe, whose folders are the user's, refuses it naming the
differences (--overwrite replaces it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..files import write_text_atomic
from .config import RESUME_KEYS, TrainConfig

DONE = "done.json"


def recipe(cfg: TrainConfig, upstream: dict | None, corrector_from: dict | None = None) -> dict:
    """What a training stage's result depends on: its schedule length and every setting a resumed run must share
    (config.RESUME_KEYS), the recipe of the stage its drafter starts from (upstream) and, for a warm-started
    corrector or head, the recipe of the one it starts from."""
    return {"steps": cfg.steps, **{k: getattr(cfg, k) for k in RESUME_KEYS}, "from": upstream,
            "corrector_from": corrector_from}


def read(out: str | Path) -> dict | None:
    """The done.json of the stage in out, or None when it has none (unfinished, or not a stage)."""
    path = Path(out) / DONE
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a stage record ({e}); remove it to train the stage again") from None
    if not isinstance(info, dict) or not isinstance(info.get("recipe"), dict):
        raise ValueError(f"{path}: not a stage record (no recipe object); remove it to train the stage again")
    return info


def write(out: str | Path, want: dict, **info) -> dict:
    """Mark the stage in out finished with recipe want; info: what it measured. Returns the record."""
    record = {**info, "recipe": want}
    write_text_atomic(Path(out) / DONE, json.dumps(record, indent=2) + "\n")
    return record


def differences(saved: dict, want: dict, where: str = "") -> list[str]:
    """What differs between two recipes, by key ("from" and "corrector_from" by their own differences)."""
    out = []
    for k in sorted(saved.keys() | want.keys()):
        a, b = saved.get(k), want.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{where}{k}.")
        else:
            out.append(f"{where}{k} ({json.dumps(a)} saved, {json.dumps(b)} now)")
    return out


def check(out: str | Path, want: dict) -> list[str] | None:
    """None when the stage in out has not finished; else how its recipe differs from want ([]: it is done)."""
    info = read(out)
    return None if info is None else differences(info["recipe"], want)


def redo_unless_done(out: Path, want: dict) -> dict | None:
    """The demo's policy: the record of the stage in out when it finished with recipe want; a stage finished with
    another recipe is removed, so it is trained again."""
    diff = check(out, want)
    if diff == []:
        return read(out)
    if diff:
        shutil.rmtree(out)
    return None


def refusal(out: str | Path, diff: list[str]) -> ValueError:
    """A recipe's policy for a stage finished with another recipe: refused, naming the differences."""
    return ValueError(f"out: {out} holds a stage finished with another recipe ({', '.join(diff)}); rerun with "
                      f"--overwrite to train it again, or give the stage another out")
