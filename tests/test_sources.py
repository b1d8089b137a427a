"""What the sources cite stays inside the repository: the spec is docs/spec.md, and no comment or docstring points
to a file outside the repo (the old SPEC.md, a notes folder) or to an issue of a tracker the repo does not hold."""

import re
from pathlib import Path

from helpers import ROOT

SOURCES = ["python", "cpp", "cuda", "bench", "scripts", "recipes", "tests", "docs", ".ci"]
SUFFIXES = {".py", ".h", ".cuh", ".cu", ".cpp", ".sh", ".toml", ".md", ""}
OUTSIDE = re.compile(r"\bSPEC\.md\b|\.\./shared|\bshared/(notes|data|seeds)\b|\bnotes/[\w-]+\.md|\b[Ii]ssues? \d+\b")


def files():
    for top in SOURCES:
        for path in (ROOT / top).rglob("*"):
            rel = path.relative_to(ROOT)
            if path.is_file() and path.suffix in SUFFIXES and not {"results", "data", "__pycache__"} & set(rel.parts):
                yield rel
    yield from (Path(name) for name in ("CMakeLists.txt", "pyproject.toml", "README.md"))


def test_sources_cite_nothing_outside_the_repo():
    hits = [f"{rel}:{n}: {line.strip()}" for rel in files() if rel != Path(__file__).relative_to(ROOT)
            for n, line in enumerate((ROOT / rel).read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, "\n".join(hits)
