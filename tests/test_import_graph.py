"""No import circles among the project's modules: every module of service/, workers/, api/ and
isosweep/ (and the bench/ scripts, which import each other as top-level modules) is parsed with
`ast`, each import that names a project module becomes an edge (deferred, function-level ones
included; `if TYPE_CHECKING:` blocks left out, they never run), and the graph's strongly
connected components must all be single modules. A failure prints every circle, one path each.

An import names the module it loads: `import a.b`, `from a.b import c` (a.b.c when that is a
module, else a.b), `from . import x` resolved against the importing module's package. The
package's own `__init__` that Python runs on the way is not an edge: an `__init__` that gathers
its submodules would otherwise close a circle with each of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("service", "workers", "api", "isosweep")
SCRIPTS = ("bench",)  # folders of scripts that import each other by file name


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for the packages and the script folders under `root`."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for folder in SCRIPTS:
        for path in sorted((root / folder).glob("*.py")):
            found[path.stem] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: at module level, in functions, classes, try
    blocks; not under `if TYPE_CHECKING:` (its `else:` runs, so it counts)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that module `name` (file `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()

    def nearest(dotted: str) -> str | None:  # the module itself, else its package
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)]
                head = ".".join([*base, *([node.module] if node.module else [])])
            else:
                head = node.module or ""
            candidates = [f"{head}.{alias.name}" if head else alias.name for alias in node.names]
            candidates = [c if c in known else head for c in candidates]
        targets |= {t for c in candidates if (t := nearest(c)) is not None}
    targets.discard(name)
    return targets


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {name: imported(name, path, known) for name, path in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def cycle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One circle inside `component`, from its first module back to it (breadth first: the
    shortest)."""
    start, members = component[0], set(component)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [*reversed(path), start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not strongly connected")


def circles(root: Path = ROOT) -> list[str]:
    """Each tangle of the project's imports as one circle through it, "a → b → a", and the
    tangle's other modules when the circle does not pass them all."""
    graph = import_graph(root)
    found = []
    for component in strongly_connected(graph):
        cycle = cycle_through(graph, component)
        rest = sorted(set(component) - set(cycle))
        found.append(" → ".join(cycle) + (f" (tangled with {', '.join(rest)})" if rest else ""))
    return found


# --- the graph check itself -------------------------------------------------------------------


def test_no_import_circles():
    found = circles()
    assert not found, "import circles:\n  " + "\n  ".join(found)


def test_the_graph_resolves_each_kind_of_import(tmp_path):
    """A made-up tree: absolute, `from a import b` (module) and `from a.b import name`,
    relative (`from . import x`, `from ..p import y`), deferred inside a function; a
    TYPE_CHECKING import is no edge; bench scripts by file name."""
    files = {
        "service/__init__.py": "from service import a  # the package gathers a: no circle\n",
        "service/a.py": "import service.b\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from service import c\n",
        "service/b.py": "def f():\n    from . import c\n",
        "service/c.py": "from service.a import something\n",
        "service/sub/__init__.py": "",
        "service/sub/d.py": "from ..b import f\nfrom .e import g\n",
        "service/sub/e.py": "import numpy\n",
        "workers/__init__.py": "",
        "api/__init__.py": "",
        "isosweep/__init__.py": "",
        "bench/one.py": "def main():\n    import two\n",
        "bench/two.py": "from one import x\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph["service"] == {"service.a"}
    assert graph["service.a"] == {"service.b"}  # not c: under TYPE_CHECKING
    assert graph["service.b"] == {"service.c"} and graph["service.c"] == {"service.a"}
    assert graph["service.sub.d"] == {"service.b", "service.sub.e"}
    assert graph["service.sub.e"] == set() and graph["one"] == {"two"}
    assert strongly_connected(graph) == [["one", "two"], ["service.a", "service.b", "service.c"]]
    assert circles(tmp_path) == [
        "one → two → one",
        "service.a → service.b → service.c → service.a",
    ]
