"""The repository speaks only of itself: what the sources cite stays inside it (the spec is docs/spec.md; no file
outside the repo, no issue of a tracker it does not hold), no text says how the project was developed (PROCESS),
and every backticked path to a repo file names one that exists."""

import re
from pathlib import Path

from helpers import ROOT

SOURCES = ["python", "cpp", "cuda", "bench", "scripts", "recipes", "tests", "docs", ".ci"]
SUFFIXES = {".py", ".h", ".cuh", ".cu", ".cpp", ".sh", ".toml", ".md", ""}
OUTSIDE = re.compile(r"\bSPEC\.md\b|\.\./shared|\bshared/(notes|data|seeds)\b|\bnotes/[\w-]+\.md|\b[Ii]ssues? \d+\b")
# words about how the project was made rather than what it is, and history read back from git
PROCESS = re.compile(r"\bthis (change|issue|session)\b|\b(a|the|earlier|next|each|every) sessions?\b|\bsessions of\b"
                     r"|\blent\b|\bnot_drawn\b|\bgive_back\b|\bdevice tool\b|\bat the start of this\b"
                     r"|\bgit show [0-9a-f]{6,}", re.I)
# a backticked path into the repo: from a top-level folder, or from the package (dcoco/...: under python/, or the
# C++ headers' dcoco/ under cpp/include); placeholders (<...>, *, {...}, $VAR, ~) and ::test ids are not paths
REPO_PATH = re.compile(r"`((?:python|tests|bench|scripts|docs|cuda|cpp|recipes|data|\.ci|build_backend|cmake|dcoco)/"
                       r"[^`\s]*)`")
ROOTS = (ROOT, ROOT / "python", ROOT / "python" / "dcoco", ROOT / "cpp" / "include")


def files():
    for top in SOURCES:
        for path in (ROOT / top).rglob("*"):
            rel = path.relative_to(ROOT)
            if path.is_file() and path.suffix in SUFFIXES and not {"results", "data", "__pycache__"} & set(rel.parts):
                yield rel
    yield from (Path(name) for name in ("CMakeLists.txt", "pyproject.toml", "README.md", "CONTRIBUTING.md"))


def lines():
    this = Path(__file__).relative_to(ROOT)
    for rel in files():
        if rel != this:
            for n, line in enumerate((ROOT / rel).read_text(errors="replace").splitlines(), 1):
                yield f"{rel}:{n}", line


def stale_paths(line: str) -> list[str]:
    """The backticked repo paths in line that name no file or folder of the repo."""
    out = []
    for token in REPO_PATH.findall(line):
        path = re.sub(r":[\d,-]+$", "", token.split("::")[0]).rstrip(".,;:)")
        if not any(c in path for c in "<*{$~[") and not any((r / path).exists() for r in ROOTS):
            out.append(token)
    return out


def test_sources_cite_nothing_outside_the_repo():
    hits = [f"{where}: {line.strip()}" for where, line in lines() if OUTSIDE.search(line)]
    assert not hits, "\n".join(hits)


def test_no_text_tells_how_the_repo_was_made():
    hits = [f"{where}: {line.strip()}" for where, line in lines() if PROCESS.search(line)]
    assert not hits, "\n".join(hits)


def test_backticked_paths_exist():
    hits = [f"{where}: {stale}" for where, line in lines() for stale in stale_paths(line)]
    assert not hits, "\n".join(hits)


def test_the_checks_catch_what_they_are_for():
    """A planted stale path and planted words about the making are caught; real paths and placeholders are not."""
    assert stale_paths("see `python/dcoco/vllm_model.py` and `bench/baselines.py`") == [
        "python/dcoco/vllm_model.py", "bench/baselines.py"]
    assert stale_paths("`dcoco/serve/vllm_model.py`, `cpp/bindings.cpp:2`, `tests/ops/test_ops.py::test_x`, "
                       "`bench/results/<study>/`, `dcoco/ops/*.py`, `vllm/config/vllm.py`") == []
    for planted in ("No GPU has been lent to this project yet.", "Measured at the start of this issue.",
                    "Fixed in this change.", "the sessions of 2026-11-29 said not_drawn",
                    "To see it again: git show db62c0b:python/dcoco/native.py"):
        assert PROCESS.search(planted), planted
