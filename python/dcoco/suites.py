"""Prompt suites: JSONL files of {"turns": [...]} lines (the paper's, shipped in dcoco/data/suites), found, read and
subsetted as `dcoco bench` and `dcoco eval` draw them: the paper's catalogue and table order, its subsets and --rows."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from .jsonl import BadLine, read_lines

# the paper's ten suites in its table order: file stem -> (domain, name shown)
SUITES = {"math500": ("Math", "MATH-500"), "aime25": ("Math", "AIME-25"), "gsm8k": ("Math", "GSM8K"),
          "humaneval": ("Code", "HumanEval"), "mbpp": ("Code", "MBPP"), "livecodebench": ("Code", "LiveCodeBench"),
          "mt-bench": ("General", "MT-Bench"), "arena-hard-v2": ("General", "Arena-Hard-v2"),
          "alpaca": ("General", "Alpaca"), "speed-bench": ("General", "SPEED-Bench")}
SEED = 1234  # the paper's subset seed
ROWS = 128  # the paper's rows per suite; smaller suites (AIME-25: 30, MT-Bench: 80) are taken whole
PER_CATEGORY = 80  # SPEED-Bench: 80 rows of each category
ALL = -1  # --rows all

SUITES_HINT = ("prompt suites are JSONL files of {\"turns\": [...]} lines (like the eval_datasets/ folder of the "
               "DeepSpec repository, which dcoco ships in dcoco/data/suites); pass a folder or files with --suites")


def default_suites() -> Path:
    """$DCOCO_SUITES, else the suites shipped in the package (data/suites: 8 of the paper's 10, its README)."""
    return Path(os.environ.get("DCOCO_SUITES") or str(resources.files("dcoco") / "data" / "suites"))


def suite_files(paths: Sequence[str | Path] | None, arg: str = "suites") -> list[Path]:
    """The .jsonl files named by paths (folders: every *.jsonl in them; None: default_suites()), distinct stems.
    ValueError, prefixed with arg, names what is missing."""
    if not paths:
        if not default_suites().is_dir():
            raise ValueError(f"{arg}: no default suites at {default_suites()}; {SUITES_HINT}")
        paths = [default_suites()]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.jsonl"))
            if not found:
                raise ValueError(f"{arg}: no *.jsonl files in {p}; {SUITES_HINT}")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise ValueError(f"{arg}: {p} does not exist; {SUITES_HINT}")
    for i, f in enumerate(files):
        if f.stem in (g.stem for g in files[:i]):
            raise ValueError(f"{arg}: two suites named {f.stem!r} ({f})")
    return files


def load_suites(paths: Sequence[str | Path] | None = None, rows: int = 8) -> dict[str, list[str]]:
    """{suite name (file stem): the first user turn of its first `rows` lines}. paths: folders (every *.jsonl
    in them) or .jsonl files; None = default_suites(). ValueError names what is missing or malformed."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows: expected an integer >= 1, got {rows!r}")
    # first turn only: a second needs the first's answer in the context
    return {f.stem: [r["turns"][0] for r in read(f, "suites")[:rows]] for f in suite_files(paths)}


def parse_rows(text: str | None) -> int | None:
    """--rows: None (the paper's subsets), 'all' (ALL) or an integer >= 1."""
    if text is None:
        return None
    if text == "all":
        return ALL
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--rows: expected an integer >= 1 or 'all', got {text!r}")
    return int(text)


def order(names) -> list[str]:
    """The paper's table order, then other suites by name."""
    return sorted(names, key=lambda n: (list(SUITES).index(n) if n in SUITES else len(SUITES), n))


def read(path: Path, arg: str = "--suites") -> list[dict]:
    """Every row {"turns": [...], "category"?} of a suite file; ValueError, prefixed with arg, names a bad line."""
    expected = "expected {\"turns\": [...]}"
    rows = []
    try:
        for n, row in read_lines(path.read_text(encoding="utf-8")):
            if not isinstance(row, dict) or "turns" not in row:
                raise ValueError(f"{arg}: {path} line {n}: {expected}")
            turns = row["turns"]
            if not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)):
                raise ValueError(f"{arg}: {path} line {n}: turns must be a non-empty list of strings")
            rows.append({"turns": turns, **({"category": row["category"]} if "category" in row else {})})
    except BadLine as e:
        raise ValueError(f"{arg}: {path} line {e.line}: {expected}") from None
    if not rows:
        raise ValueError(f"{arg}: {path} has no rows")
    return rows


def load(paths: Sequence[str | Path] | None = None, arg: str = "--suites") -> dict[str, list[dict]]:
    """{suite (file stem): rows {"turns": [...], "category"?}} in table order, every turn kept. paths: folders
    (every *.jsonl in them) or .jsonl files; None = default_suites(). arg: the name errors give the paths."""
    out = {f.stem: read(f, arg) for f in suite_files(paths, arg)}
    return {n: out[n] for n in order(out)}


def _draw(idx: Sequence[int], n: int) -> list[int]:
    return list(idx) if n == ALL or len(idx) <= n else random.Random(SEED).sample(list(idx), n)


def subset(name: str, rows: Sequence[dict], n: int | None = None) -> list[int]:
    """Row indices, in file order. n None: the paper's subset, ROWS rows drawn with random.Random(SEED).sample
    (a smaller suite whole; SPEED-Bench: PER_CATEGORY rows of each category when its rows carry one); n >= 1: n
    rows drawn the same way; ALL: all."""
    if n is None and name == "speed-bench" and all("category" in r for r in rows):
        by: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            by.setdefault(str(r["category"]), []).append(i)
        return sorted(i for c in sorted(by) for i in _draw(by[c], PER_CATEGORY))
    return sorted(_draw(range(len(rows)), ROWS if n is None else n))
