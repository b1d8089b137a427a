"""Each `dcoco` command's extra installs what the command imports.

A command's code is its module's run() (cli/__init__.py's COMMANDS), with what importing dcoco.cli runs. From
there the walk follows what the code uses: the dcoco modules it imports (their top level runs), and the dcoco
functions and classes it names, whose bodies may run, imports inside them included; on, transitively. Every
third-party module met must come from a distribution in [project].dependencies or in the command's extra. The
vLLM plugin (the entry point) is checked against [vllm] the same way. Pure AST: nothing is imported.

An import inside `try:` that handles its ImportError (a --hub dataset, say) is optional: the code says what to
install when it is missing."""

from __future__ import annotations

import ast
import re
import sys
from collections import deque
from functools import cache
from pathlib import Path

from helpers.imports import PKG, PYPROJECT, ImportVisitor, declared, distribution


# the extra each command needs beyond [project].dependencies (None: none); cli/__init__.py's commands must match
# the keys
COMMAND_EXTRA = {
    "demo": "demo",
    "info": None,
    "export-smollm2": "demo",  # the embedded target ships for the demo
    "data": "train",
    "export": "demo",  # --draft-vocab reads the target's LM head rows; the rest needs no extra
    "train": "train",
    "eval": "train",
    "bench": "bench",
}
ENTRY_POINT_EXTRA = {"vllm.general_plugins": "vllm"}
MODULE_REF = re.compile(r"^(dcoco(?:\.\w+)+):\w+$")  # "dcoco.mod:attr", imported by name (the vLLM registry)


class Imports(ImportVisitor):
    """The modules some code imports: (absolute dotted name, optional), relative ones resolved in `package`."""

    def __init__(self, package: str):
        super().__init__()
        self.package = package

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = absolute(node, self.package)
        self.found.append((base, bool(self.optional)))
        self.found += [(f"{base}.{a.name}", bool(self.optional)) for a in node.names if module_file(f"{base}.{a.name}")]

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and (m := MODULE_REF.match(node.value)):
            self.found.append((m[1], bool(self.optional)))


def absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module
    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def module_file(name: str) -> Path | None:
    if name.split(".")[0] != "dcoco":
        return None
    parts = name.split(".")[1:]
    for path in (PKG.joinpath(*parts).with_suffix(".py") if parts else None, PKG.joinpath(*parts, "__init__.py")):
        if path is not None and path.is_file():
            return path
    return None


class Module:
    """A dcoco module cut into units: its top level (what importing it runs) and each top-level function or class
    (what calling or using it may run, its nested code included), with the names its imports bind."""

    def __init__(self, name: str):
        path = module_file(name)
        self.name, self.package = name, name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        if any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and "annotations" in {a.name for a in n.names}
               for n in tree.body):
            for node in ast.walk(tree):  # annotations are strings then: never evaluated
                for field in ("annotation", "returns"):
                    if getattr(node, field, None) is not None:
                        setattr(node, field, None)
        defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        self.defs = {n.name: n for n in tree.body if isinstance(n, defs)}
        self.top: list[ast.AST] = []
        for stmt in tree.body:
            if isinstance(stmt, ast.If) and re.search(r"TYPE_CHECKING|'__name__'", ast.dump(stmt.test)):
                continue  # type checkers only; running the file as a script
            self.top += self._runs_at_import(stmt)
        self.bindings: dict[str, tuple[str, str | None]] = {}  # name -> (module, attribute or None)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:  # `import a.b` binds a; `import a.b as c` binds c to a.b
                    self.bindings[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0],
                                                                       None)
            elif isinstance(node, ast.ImportFrom):
                base = absolute(node, self.package)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    self.bindings[a.asname or a.name] = (sub, None) if module_file(sub) else (base, a.name)

    @staticmethod
    def _runs_at_import(stmt: ast.stmt) -> list[ast.AST]:
        """What of a top-level statement runs when the module is imported: not the bodies of functions."""
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return [*stmt.decorator_list, *stmt.args.defaults, *(d for d in stmt.args.kw_defaults if d)]
        if isinstance(stmt, ast.ClassDef):
            return [*stmt.decorator_list, *stmt.bases, *stmt.keywords,
                    *(n for b in stmt.body for n in Module._runs_at_import(b))]
        return [stmt]

    def code(self, unit: str | None) -> list[ast.AST]:
        return self.top if unit is None else [self.defs[unit]]

    def targets(self, nodes: list[ast.AST]) -> list[tuple[str, str | None]]:
        """The dcoco units this code names: its own functions and classes, and what its imports bound."""
        out = []
        for node in (n for root in nodes for n in ast.walk(root)):
            if isinstance(node, ast.Name):
                if node.id in self.defs:
                    out.append((self.name, node.id))
                elif node.id in self.bindings:
                    out.append(self.bindings[node.id])
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                mod, attr = self.bindings.get(node.value.id, (None, None))
                if mod and attr is None:
                    out.append((mod, node.attr))
        return [t for t in out if t[0].split(".")[0] == "dcoco"]


@cache
def module(name: str) -> Module:
    return Module(name)


def resolve(mod: str, attr: str | None, depth: int = 0) -> list[tuple[str, str | None]]:
    """The units (module, name or None for its top level) that using mod.attr may run."""
    if not module_file(mod):
        return []  # the compiled dcoco._C
    units = [(mod, None)]
    m = module(mod)
    if attr in m.defs:
        units.append((mod, attr))
    elif attr and module_file(f"{mod}.{attr}"):
        units.append((f"{mod}.{attr}", None))
    elif attr in m.bindings and depth < 8:  # a name re-exported, e.g. dcoco.Corrector
        units += resolve(*m.bindings[attr], depth + 1)
    return units


def third_party(roots: list[str], extra_code: tuple[str, list[ast.AST]] | None = None) -> dict[str, str]:
    """{top-level third-party module: the chain of dcoco units that imports it}, over everything reachable from
    the modules in roots (importing them, and using every function and class they name, transitively) and from
    extra_code, (module, code): code as if it were in that module."""
    out: dict[str, str] = {}
    seen: set[tuple[str, str | None]] = set()
    todo = deque([((r, None), r, None) for r in roots])  # breadth first: the shortest chain is the one shown
    if extra_code:
        todo.appendleft(((extra_code[0], "<code>"), extra_code[0], extra_code[1]))
    while todo:
        (mod, unit), chain, nodes = todo.popleft()
        if (mod, unit) in seen or not module_file(mod):
            continue
        seen.add((mod, unit))
        m = module(mod)
        nodes = m.code(unit) if nodes is None else nodes
        follow = [("dcoco", None), (mod, None)]  # importing dcoco.x runs dcoco/__init__.py, then x's top level
        for name, optional in imports_of(nodes, m.package):
            if optional:
                continue
            if name.split(".")[0] == "dcoco":
                follow.append((name, None))
            elif name.split(".")[0] not in sys.stdlib_module_names:
                out.setdefault(name.split(".")[0], f"{chain} -> {name}")
        for target in m.targets(nodes):
            follow += resolve(*target)
        for mod2, unit2 in follow:
            label = mod2 if unit2 is None else f"{mod2}.{unit2}"
            todo.append(((mod2, unit2), f"{chain} -> {label}", None))
    return out


def imports_of(nodes: list[ast.AST], package: str) -> list[tuple[str, bool]]:
    v = Imports(package)
    for node in nodes:
        v.visit(node)
    return v.found




@cache
def cli_commands() -> dict[str, str]:
    """{command: the module whose run() runs it}, from cli/__init__.py's COMMANDS ({name: (module, help)})."""
    tree = ast.parse((PKG / "cli" / "__init__.py").read_text())
    table = next(st.value for st in tree.body if isinstance(st, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "COMMANDS" for t in st.targets))
    return {k.value: f"dcoco.cli.{v.elts[0].id}" for k, v in zip(table.keys, table.values)}


@cache
def command_imports(command: str) -> dict[str, str]:
    mod = cli_commands()[command]
    return third_party(["dcoco.cli"], (mod, module(mod).code("run")))


def entry_points() -> dict[str, list[str]]:
    """{entry-point group: the modules it loads} from [project.entry-points]."""
    groups = PYPROJECT["project"].get("entry-points", {})
    return {g: [v.split(":")[0] for v in eps.values()] for g, eps in groups.items()}


def undeclared(found: dict[str, str], extra: str | None) -> list[str]:
    have = declared(extra)
    return [f"{mod} (distribution {'/'.join(sorted(distribution(mod)))}), imported via {chain}"
            for mod, chain in sorted(found.items()) if not distribution(mod) & have]


def test_every_command_has_an_extra():
    commands = cli_commands()
    assert set(commands) == set(COMMAND_EXTRA), "a dcoco command without an entry in COMMAND_EXTRA, or one gone"
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {e for e in [*COMMAND_EXTRA.values(), *ENTRY_POINT_EXTRA.values()] if e} <= set(extras)
    assert set(entry_points()) == set(ENTRY_POINT_EXTRA)
    assert PYPROJECT["project"]["scripts"] == {"dcoco": "dcoco.cli:main"}


def test_each_command_extra_installs_what_it_imports():
    missing = {f"dcoco {c} [{COMMAND_EXTRA[c] or 'no extra'}]": bad for c in cli_commands()
               if (bad := undeclared(command_imports(c), COMMAND_EXTRA[c]))}
    assert not missing, missing


def test_the_vllm_plugin_extra_installs_what_it_imports():
    missing = {g: bad for g, roots in entry_points().items()
               if (bad := undeclared(third_party(roots), ENTRY_POINT_EXTRA[g]))}
    assert not missing, missing


def test_the_walk_sees_lazy_and_optional_imports():
    assert "scipy" in command_imports("demo")  # dcoco.specdec.stats imports it inside its functions
    assert "scipy" not in command_imports("info")  # `dcoco info` runs none of that
    assert "datasets" not in command_imports("bench")  # optional: try/except ImportError
    assert "vllm" in third_party(["dcoco.serve.vllm_plugin"])  # optional itself; "dcoco.serve.vllm_model:..." is not
