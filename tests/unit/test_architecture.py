"""Imports point down: the import graph of src/kvguardian, built from the AST, has no cycle.

Every import counts - at module level, inside functions, and under ``if TYPE_CHECKING:`` (two modules that
import each other know each other, whenever the import runs). ``from a import b`` is an edge to the module
``a.b`` when there is one, else to ``a``; relative imports are resolved against the importing module's
package. A package's ``__init__`` importing its own submodules is not a cycle by itself: a submodule that
imports a sibling does not import the package's ``__init__`` (Python runs it first, but that is no dependency).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "kvguardian"

def modules_of(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package rooted at ``package_dir``."""
    base = package_dir.parent
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> Iterator[str]:
    """The modules of ``known`` that one import statement of ``module`` names."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield from _longest_known(alias.name, known)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            package = module if is_package else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{node.module}" if node.module else package
        else:
            base = node.module or ""
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            if candidate in known:  # `from pkg import submodule`
                yield candidate
            else:  # `from module import name`
                yield from _longest_known(base, known)


def _longest_known(name: str, known: dict[str, Path]) -> Iterator[str]:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in known:
            yield prefix
            return


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in its file, TYPE_CHECKING included)."""
    known = modules_of(package_dir)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(t for t in _imported(node, module, is_package, known) if t != module)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
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
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A concrete cycle through ``component``: a → b → ... → a (breadth-first back to the start)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"no cycle through {sorted(component)}")  # pragma: no cover - a component has one


def describe(graph: dict[str, set[str]], components: Iterable[set[str]]) -> str:
    return "; ".join(" → ".join(one_cycle(graph, c)) for c in components)


GRAPH = import_graph(PACKAGE)
CYCLES = strongly_connected(GRAPH)


def test_no_import_cycles():
    assert not CYCLES, f"import cycles among kvguardian modules (imports must point down): {describe(GRAPH, CYCLES)}"


def folder_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """One folder level: ``package``'s direct children (modules and subpackages) -> the children their modules
    import. The package's own ``__init__`` is its face, not a child: it may re-export what its children define."""
    prefix = package + "."

    def child(module: str) -> str | None:
        return prefix + module[len(prefix):].split(".")[0] if module.startswith(prefix) else None

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        src = child(module)
        if src is None:
            continue
        out.setdefault(src, set()).update(t for t in map(child, targets) if t is not None and t != src)
    for targets in list(out.values()):
        for t in targets:
            out.setdefault(t, set())
    return out


def test_every_folder_level_is_a_dag():
    """The tree reads as layers at every level: among the children of any package (the wings under kvguardian,
    the modules of each wing) no two import each other, directly or around a loop. No exception list."""
    packages = sorted(m for m, path in modules_of(PACKAGE).items() if path.name == "__init__.py")
    found = []
    for package in packages:
        level = folder_graph(GRAPH, package)
        found += [f"{package}: {describe(level, [c])}" for c in strongly_connected(level)]
    assert not found, "folders that import each other:\n" + "\n".join(found)


def test_a_folder_level_cycle_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from pkg.a import x\nfrom pkg.b import y\n")  # the face: no cycle
    (pkg / "a" / "x.py").write_text("from pkg.b import y\n")
    (pkg / "b" / "y.py").write_text("")
    assert not strongly_connected(folder_graph(import_graph(pkg), "pkg"))
    (pkg / "b" / "z.py").write_text("def f():\n    from pkg.a import x\n")
    [cycle] = strongly_connected(folder_graph(import_graph(pkg), "pkg"))
    assert cycle == {"pkg.a", "pkg.b"}


def test_the_graph_sees_type_checking_relative_and_from_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import a\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import thing\n")
    (pkg / "c.py").write_text("from . import a\nimport pkg.sub.b as bb\n")
    (pkg / "d.py").write_text("from pkg import c, sub\n")
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.a"}
    assert graph["pkg.a"] == {"pkg.sub.b"}  # under TYPE_CHECKING
    assert graph["pkg.sub.b"] == {"pkg.c"}  # relative, inside a function
    assert graph["pkg.c"] == {"pkg.a", "pkg.sub.b"}
    assert graph["pkg.d"] == {"pkg.c", "pkg.sub"}
    [cycle] = strongly_connected(graph)
    assert cycle == {"pkg.a", "pkg.sub.b", "pkg.c"}
    assert describe(graph, [cycle]) == "pkg.a → pkg.sub.b → pkg.c → pkg.a"


def test_the_sources_do_not_know_the_guard():
    """The sources talk to the rest through `kvguardian.runtime.sources.host` (a Protocol), never to the guard."""
    sources = [m for m in GRAPH if m.startswith(("kvguardian.runtime.hf", "kvguardian.runtime.sources"))]
    sources += ["kvguardian.runtime.custom", "kvguardian.runtime.retention", "kvguardian.runtime.ranks"]
    offenders = sorted(m for m in sources if "kvguardian.runtime.guard" in GRAPH[m])
    assert not offenders, f"sources importing kvguardian.runtime.guard: {offenders}"


# The wings of ARCHITECTURE.md: which wings each wing's modules may import (besides its own). The core knows no
# product; the product wings know only the core (ops also the runtime it guards); apps sit on top of all.
WINGS: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "runtime": frozenset({"core"}),
    "ops": frozenset({"core", "runtime"}),
    "keyspace": frozenset({"core"}),
    "lint": frozenset({"core"}),
    "triton": frozenset({"core"}),
    "isolation": frozenset({"core"}),
    "apps": frozenset({"core", "runtime", "ops", "keyspace", "lint", "triton", "isolation"}),
    # the package's face (`kvguardian/__init__`: Guard, Ledger, findings), `python -m kvguardian`, the old paths
    "kvguardian": frozenset({"core", "runtime"}),
    "__main__": frozenset({"apps"}),
    "_moved": frozenset(),
}


#: what every wing may import: the package's face (``__version__``; Guard and Ledger load lazily) and the old paths
EVERYONE = frozenset({"kvguardian", "_moved"})


def wing_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kvguardian"


def test_wings_import_only_the_wings_below_them():
    unknown = sorted({wing_of(m) for m in GRAPH} - WINGS.keys())
    assert not unknown, f"wings ARCHITECTURE.md and WINGS do not place: {unknown}"
    crossing = sorted(f"{m} ({wing_of(m)}) imports {t} ({wing_of(t)})"
                      for m, targets in GRAPH.items() for t in targets
                      if wing_of(t) != wing_of(m) and wing_of(t) not in WINGS[wing_of(m)] | EVERYONE)
    assert not crossing, "imports across wings that the wings' order forbids:\n" + "\n".join(crossing)


# The layers of ARCHITECTURE.md, bottom up: a module may import its own layer and those below, never above.
# A name is a dotted path under kvguardian (a wing's package or module), placed by its longest listed prefix.
LAYERS: dict[int, tuple[str, ...]] = {
    0: ("core.errors", "core.faults", "core.findings", "core.options", "core.input_file", "core.callsite", "core",
        "_moved"),
    1: ("core.ledger", "core.tensors", "core.reuse"),
    2: ("core.detectors", "core.accounting", "core.report", "core.exporters"),
    3: ("runtime.sources", "runtime.hf", "runtime.paged", "runtime.custom", "runtime"),
    4: ("runtime.retention", "runtime.ranks"),
    5: ("runtime.guard", "runtime.check", "kvguardian"),
    6: ("runtime.engines", "runtime.autorun", "runtime.sweep", "keyspace", "ops", "lint", "triton", "isolation"),
    7: ("apps", "runtime.pytest_plugin", "__main__"),
}


def layer_of(module: str) -> int:
    """The layer of a dotted module name of the package (``kvguardian.x.y``): its longest listed prefix."""
    where = {name: n for n, names in LAYERS.items() for name in names}
    parts = module.split(".")[1:] or ["kvguardian"]
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in where:
            return where[name]
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS and to ARCHITECTURE.md")


def test_imports_point_down_the_layers():
    graph = import_graph(PACKAGE)
    upward = sorted(
        f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
        for m, targets in graph.items()
        for t in targets
        if layer_of(t) > layer_of(m)
    )
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_architecture_md_lists_every_package():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    wings_and_packages = [p.parent.relative_to(PACKAGE) for p in sorted(PACKAGE.glob("*/__init__.py"))]
    wings_and_packages += [p.parent.relative_to(PACKAGE) for p in sorted(PACKAGE.glob("*/*/__init__.py"))]
    missing = [str(rel) for rel in wings_and_packages if f"`{rel.name}/`" not in text]
    assert not missing, f"packages ARCHITECTURE.md does not describe: {missing}"
