"""The package's shape, read statically with ``ast`` (imports inside functions included):
imports point down only (no circles), and an import inside a function is there only to
defer a heavy dependency, with a comment saying which (``# defers torch``)."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "popplay"

#: Third-party packages whose import costs enough (seconds for torch, tenths for the
#: others) that code which does not need them must not pay for them.
HEAVY = {"torch", "numba", "numpy", "h5py", "gymnasium", "matplotlib", "scipy", "tensorboard", "stable_baselines3"}
DEFERS = re.compile(r"#.*\bdefers ([a-z0-9_]+(?:, [a-z0-9_]+)*)")


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    lines: list[str]
    top: list[ast.stmt] = field(default_factory=list)  # imports run when the module loads
    inner: list[ast.stmt] = field(default_factory=list)  # imports inside functions


def load_modules(root: Path = PACKAGE) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        text = path.read_text(encoding="utf-8")
        module = Module(name, path, is_package, ast.parse(text), text.splitlines())
        _collect(module.tree, module, inside=False)
        modules[name] = module
    return modules


def _collect(node: ast.AST, module: Module, inside: bool) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            (module.inner if inside else module.top).append(child)
        _collect(child, module, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def imported(module: Module, node: ast.stmt, known: dict[str, Module]) -> list[str]:
    """The dotted names an import statement loads: popplay modules (the deepest one
    named) and third-party or standard-library modules."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = module.name.split(".")
            base = base[:len(base) - node.level + (1 if module.is_package else 0)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in known else prefix for alias in node.names]
    out = []
    for name in names:
        if name.split(".")[0] == "popplay":
            parts = name.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            name = ".".join(parts)
        out.append(name)
    return out


def import_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, module in modules.items():
        for node in module.top + module.inner:
            graph[name].update(t for t in imported(module, node, modules) if t in modules and t != name)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components (iterative: the package is deep enough to matter)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def heavy_at_load(modules: dict[str, Module], graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The heavy packages each module loads when it is imported (its imports outside
    functions, followed through popplay's own modules)."""
    loads: dict[str, set[str]] = {}

    def visit(name: str) -> set[str]:
        if name in loads:
            return loads[name]
        loads[name] = set()  # the graph is acyclic (checked separately); this only guards recursion
        module = modules[name]
        found: set[str] = set()
        for node in module.top:
            for target in imported(module, node, modules):
                if target in modules:
                    if target != name:
                        found |= visit(target)
                elif target.split(".")[0] in HEAVY:
                    found.add(target.split(".")[0])
        loads[name] = found
        return found

    for name in modules:
        visit(name)
    return loads


def deferred(module: Module, node: ast.stmt, modules: dict[str, Module], loads: dict[str, set[str]]) -> set[str]:
    """The heavy packages an import inside a function keeps from loading with its module."""
    out: set[str] = set()
    for target in imported(module, node, modules):
        if target in modules:
            out |= loads[target]
        elif target.split(".")[0] in HEAVY:
            out.add(target.split(".")[0])
    return out - loads[module.name]


def test_imports_point_down_only() -> None:
    modules = load_modules()
    assert "popplay.core.registry" in modules and len(modules) > 50
    circles = [c for c in strongly_connected(import_graph(modules)) if len(c) > 1]
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_imports_inside_functions_defer_a_heavy_dependency_and_say_which() -> None:
    modules = load_modules()
    loads = heavy_at_load(modules, import_graph(modules))
    problems = []
    for module in modules.values():
        for node in module.inner:
            where = f"{module.path.relative_to(PACKAGE.parent)}:{node.lineno}"
            really = deferred(module, node, modules, loads)
            comment = " ".join(module.lines[node.lineno - 1:node.end_lineno])
            said = DEFERS.search(comment)
            if not really:
                problems.append(f"{where}: defers nothing heavy; import it at the top of the module")
            elif said is None:
                problems.append(f"{where}: say what it defers (# defers {', '.join(sorted(really))})")
            elif not set(said.group(1).split(", ")) <= really:
                problems.append(f"{where}: says it defers {said.group(1)}, but defers {', '.join(sorted(really))}")
    assert not problems, "\n".join(problems)


def test_the_checks_see_a_circle_and_an_idle_deferral(tmp_path: Path) -> None:
    """The checks above are only worth something if they can fail."""
    package = tmp_path / "popplay"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("import numpy\n\ndef f():\n    from popplay import b\n")
    (package / "b.py").write_text("from popplay import a\n\ndef g():\n    import json\n")
    modules = load_modules(package)
    graph = import_graph(modules)
    assert ["popplay.a", "popplay.b"] in strongly_connected(graph)
    loads = heavy_at_load(modules, graph)
    assert loads["popplay.b"] == {"numpy"}
    b = modules["popplay.b"]
    assert deferred(b, b.inner[0], modules, loads) == set()  # json is light: it belongs at the top


def test_importing_popplay_and_its_command_line_loads_no_torch() -> None:
    modules = load_modules()
    loads = heavy_at_load(modules, import_graph(modules))
    assert loads["popplay"] == set()
    assert "torch" not in loads["popplay.cli.main"] and "numba" not in loads["popplay.cli.main"]
    assert "torch" not in loads["popplay.games.bandit.experiment"]
