"""The shipped SmolLM2-135M-Instruct drafters: stages of recipes/smollm2-scale.toml, trained on the committed corpus
(data/smollm2-corpus) and committed in checkpoints/smollm2-scale, named by role in that folder's release.toml
(ROLES). `dcoco demo` evaluates them (shipped.py); `dcoco demo --drafter` reads a release drafter's provenance
(its corpus and its convergence check) from here."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

from ..jsonl import read_records
from ..target import smollm2

MANIFEST = "release.toml"
ROLES = {
    "drafter": "the DFlash drafter: the baseline, and the frozen drafter the correctors are trained on",
    "parent": "the stage the drafter continues for 50% more steps: the convergence check compares their held-out tau",
    "corrector": "DCOCO's corrector trained on the frozen drafter",
    "anchor": "the anchor-aware corrector trained on the frozen drafter",
    "joint": "DCOCO joint: the drafter and its corrector trained on together",
    "control": "the joint stage with L_corr's gradient kept out of the drafter: DFlash trained on alone for the "
               "same budget, with an online corrector",
}
REQUIRED = ("drafter",)
CONVERGED_WITHIN = 0.02  # the paper's check: 50% more steps move tau by at most 2%


@dataclasses.dataclass(frozen=True)
class Stage:
    path: Path
    step: int         # steps trained (progress.json)
    total: int        # steps the stage runs to
    tau: float | None  # the last held-out teacher-forced tau (eval.jsonl), None before the first evaluation
    config: dict       # the stage's training settings (progress.json)

    @property
    def finished(self) -> bool:
        return self.step >= self.total


@dataclasses.dataclass(frozen=True)
class Release:
    root: Path
    stages: dict[str, Stage]  # role -> stage, the roles whose folder holds a checkpoint
    missing: dict[str, Path]  # role -> folder named but not (yet) there


def load(root: str | Path) -> Release:
    """The release in root (its MANIFEST). ValueError naming the file and what is wrong: no manifest, an unknown
    role, a required role missing."""
    root = Path(root)
    manifest = root / MANIFEST
    if not manifest.is_file():
        raise ValueError(f"release: no {MANIFEST} in {root}{'' if root.is_dir() else ' (no such folder)'}; run "
                         f"`dcoco demo` from a dcoco checkout, or pass --release DIR")
    try:
        roles = tomllib.loads(manifest.read_text())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"release: {manifest}: {e}") from None
    unknown = sorted(set(roles) - set(ROLES))
    bad = [r for r, v in roles.items() if not isinstance(v, str) or not v]
    if unknown or bad or any(r not in roles for r in REQUIRED):
        raise ValueError(f"release: {manifest}: expected a folder name for each of {list(ROLES)} ({REQUIRED[0]} "
                         f"required), got {roles!r}")
    stages, missing = {}, {}
    for role, name in roles.items():
        path = root / name
        if (path / "model.safetensors").is_file() and (path / "progress.json").is_file():
            stages[role] = stage(path)
        else:
            missing[role] = path
    if "drafter" in missing:
        raise ValueError(f"release: {manifest}: its drafter {missing['drafter']} holds no trained checkpoint "
                         f"(model.safetensors and progress.json)")
    return Release(root, stages, missing)


def stage(path: Path) -> Stage:
    """A trained stage's progress, settings and last held-out tau."""
    progress = json.loads((path / "progress.json").read_text())
    evals = [r["eval_tau_dflash"] for r in read_records(path / "eval.jsonl") if "eval_tau_dflash" in r]
    return Stage(path, int(progress["step"]), int(progress["total"]), evals[-1] if evals else None,
                 progress.get("config", {}))


def converged(rel: Release) -> dict | None:
    """The convergence check: the drafter's held-out tau over its parent's (the same held-out sequences), and
    whether it holds (the drafter finished and moved tau by at most CONVERGED_WITHIN); None without a parent or
    an evaluation of both."""
    d, p = rel.stages["drafter"], rel.stages.get("parent")
    if p is None or d.tau is None or p.tau is None:
        return None
    ratio = d.tau / p.tau
    return {"drafter": d.path.name, "parent": p.path.name, "steps": d.step, "total": d.total, "tau": d.tau,
            "parent_tau": p.tau, "ratio": ratio, "tolerance": CONVERGED_WITHIN,
            "holds": d.finished and abs(ratio - 1) <= CONVERGED_WITHIN}


def corpus_tokens() -> int:
    """The committed corpus's response tokens (its manifest), what the shipped drafters are trained on."""
    return int(json.loads((smollm2.corpus_dir() / "manifest.json").read_text())["response_tokens"])


def provenance(drafter: str | Path) -> dict:
    """{"corpus_tokens", "converged"} for a drafter folder: the release's when it is the drafter of the release in
    its parent folder, None for both otherwise (a drafter trained elsewhere)."""
    drafter = Path(drafter)
    if (drafter.parent / MANIFEST).is_file():
        rel = load(drafter.parent)
        if rel.stages["drafter"].path.resolve() == drafter.resolve():
            return {"corpus_tokens": corpus_tokens(), "converged": converged(rel)}
    return {"corpus_tokens": None, "converged": None}
