"""What the dependency tests share: the declared distributions of pyproject.toml, the distribution a module comes
from, and an AST visitor that notes each import and whether a `try:` handling its ImportError makes it optional."""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from importlib import metadata

from helpers import ROOT

PKG = ROOT / "python" / "dcoco"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CATCHES_IMPORT_ERROR = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def req_name(req: str) -> tuple[str, list[str]]:
    """(normalised name, extras) of a requirement string, version and markers dropped."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", req)
    return norm(m[1]), [norm(e) for e in (m[2] or "").split(",") if e.strip()]

def declared(extra: str | None) -> set[str]:
    """Distributions installed by `pip install dcoco[extra]` directly (dcoco[...] self-references followed)."""
    project = PYPROJECT["project"]
    todo, seen, names = [*project["dependencies"], *project["optional-dependencies"].get(extra or "", [])], set(), set()
    while todo:
        name, extras = req_name(todo.pop())
        if name == "dcoco":
            for e in set(extras) - seen:
                seen.add(e)
                todo += project["optional-dependencies"][e]
        else:
            names.add(name)
    return names


@cache
def distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distribution(module_name: str) -> set[str]:
    return {norm(d) for d in distributions().get(module_name, [module_name])}  # not installed here (vllm): its name


class ImportVisitor(ast.NodeVisitor):
    """Collects (module name, optional) in `found`; subclasses say what a `from ... import` names."""

    def __init__(self):
        self.found: list[tuple[str, bool]] = []
        self.optional = 0

    def visit_Try(self, node: ast.Try) -> None:
        types = [t for h in node.handlers for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])]
        handles = any(t is None or getattr(t, "id", getattr(t, "attr", "")) in CATCHES_IMPORT_ERROR for t in types)
        self.optional += handles
        for stmt in node.body:
            self.visit(stmt)
        self.optional -= handles
        for stmt in [*node.handlers, *node.orelse, *node.finalbody]:
            self.visit(stmt)

    visit_TryStar = visit_Try

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(a.name, bool(self.optional)) for a in node.names]
