"""The package's rules that no linter checks, on the source without importing it (import-linter checks the layers
and cycles, `lint-imports` in .ci/run; deptry the declared dependencies as a whole).

Every import of every module of python/dcoco counts: at module level and inside functions, absolute and relative.
(a) A module is at most MAX_LINES long and each function at most MAX_FUNCTION_LINES. (b) Each third-party import
comes from a distribution that dcoco declares for that module: [project].dependencies, plus the extras of its layer
(EXTRAS) or its own (MODULE_EXTRAS). (c) No module reads a private name of a module in another layer."""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

from helpers.imports import PKG, ImportVisitor, declared, distribution, norm


LAYERS = ("dcoco", "ops", "top", "modeling", "target", "train", "specdec", "serve", "benchmark", "experiments", "cli",
          "testing")
MAX_LINES, MAX_FUNCTION_LINES = 450, 80
# extras beyond [project].dependencies, per layer, and per module where one module needs more than its layer
EXTRAS = {"ops": (), "top": (), "modeling": (), "dcoco": (), "target": ("train",), "train": ("train",),
          "specdec": ("train",), "experiments": ("train", "demo"), "cli": ("train", "demo", "bench"), "serve": (),
          "benchmark": ("bench",), "testing": ("test",)}
MODULE_EXTRAS = {"dcoco.serve.vllm_model": ("vllm",), "dcoco.serve.vllm_tp": ("vllm",),
                 "dcoco.serve.vllm_patches": ("vllm",), "dcoco.plots": ("demo", "bench"),
                 "dcoco.chat": ("train", "bench"), "dcoco.modeling.llamacpp": ("demo",)}
# distributions installed by one that dcoco declares
COMES_WITH = {"tokenizers": "transformers", "huggingface-hub": "transformers"}


@cache
def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def is_module(name: str) -> bool:
    return name in modules() or name == "dcoco._C"


def layer(name: str) -> str:
    if name == "dcoco":
        return "dcoco"
    sub = name.split(".")[1]
    if sub == "_C":
        return "ops"
    return sub if (PKG / sub).is_dir() else "top"


class Imports(ImportVisitor):
    """(imported dcoco module or third-party name, optional) of one module; relative imports resolved."""

    def __init__(self, name: str, path: Path):
        super().__init__()
        self.package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module
        for a in node.names:  # `from pkg import mod` imports the module; `from mod import name`, the module
            sub = f"{base}.{a.name}"
            self.found.append((sub if is_module(sub) else base, bool(self.optional)))


@cache
def imports(name: str) -> list[tuple[str, bool]]:
    path = modules()[name]
    v = Imports(name, path)
    v.visit(ast.parse(path.read_text(), str(path)))
    return v.found


def dcoco_imports(name: str) -> set[str]:
    return {m for m, _ in imports(name) if m.split(".")[0] == "dcoco" and m != name}


def test_every_subpackage_is_a_package():
    folders = {p.parent for p in PKG.rglob("*.py")}
    assert all((f / "__init__.py").is_file() for f in folders), sorted(map(str, folders))
    assert {layer(m) for m in modules()} <= set(LAYERS)


def test_no_module_reads_a_private_name_of_another_layer():
    """`from dcoco.x import _name` and `x._name` on an imported dcoco module, across layers."""
    bad = []
    for m, path in modules().items():
        tree = ast.parse(path.read_text())
        aliases = {}  # local name -> dcoco module, for `import dcoco.x as y` and `from dcoco import x`
        v = Imports(m, path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                v.found = []
                v.visit_ImportFrom(node)
                for a, (target, _) in zip(node.names, v.found):  # target: the module, or the one holding a.name
                    if is_module(target) and target.endswith("." + a.name):
                        aliases[a.asname or a.name] = target
                    elif a.name.startswith("_") and not a.name.startswith("__") and layer(target) != layer(m):
                        bad.append(f"{m} imports {target}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("dcoco.") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                target = aliases[node.value.id]
                if node.attr.startswith("_") and not node.attr.startswith("__") and layer(target) != layer(m) \
                        and target != "dcoco._C":
                    bad.append(f"{m} reads {target}.{node.attr}")
    assert not bad, bad


def test_modules_are_short():
    lines = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    long = {m: n for m, n in lines.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_functions_are_short():
    long = [f"{m}.{f.name} ({f.end_lineno - f.lineno + 1} lines)" for m, p in modules().items()
            for f in ast.walk(ast.parse(p.read_text())) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_each_module_imports_what_its_extras_install():
    missing = []
    for m in modules():
        extras = MODULE_EXTRAS.get(m, EXTRAS[layer(m)])
        have = set().union(declared(None), *(declared(e) for e in extras))
        have |= {d for d, parent in COMES_WITH.items() if parent in have}
        for name, optional in imports(m):
            top = name.split(".")[0]
            if optional or top == "dcoco" or top in sys.stdlib_module_names or top == "__future__":
                continue
            if not distribution(top) & have:
                missing.append(f"{m}: {top} (distribution {'/'.join(sorted(distribution(top)))}) is in none of "
                               f"[project].dependencies{''.join(f', [{e}]' for e in extras)}")
    assert not missing, missing


def test_the_walk_sees_every_kind_of_import():
    assert "dcoco.ops.native" in dcoco_imports("dcoco.ops.select")  # from . import a, b
    assert "dcoco._C" in dcoco_imports("dcoco.ops.backend")  # from .. import _C
    assert "dcoco.modeling.checkpoint" in dcoco_imports("dcoco.specdec.evaluate")  # inside a function
    assert ("datasets", True) in imports("dcoco.benchmark.client")  # optional: try/except ImportError
    assert norm("huggingface_hub") == "huggingface-hub"
