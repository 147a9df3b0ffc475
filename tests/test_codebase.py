"""Rules of the code base that no single feature test sees: the layering of docs/architecture.md
(nothing imports upward) and comments a reader without the project's tracker can follow."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "moment"

#: errors -> base helpers -> topology/workload/io/caching -> planner -> placement/cost -> runtime ->
#: cli/service (a module may import its own layer and the ones below, never one above)
LAYERS = {
    "errors": 0,
    "outputs": 1, "sizes": 1, "locking": 1, "testpoints": 1, "inputs": 1, "documents": 1, "lazy": 1, "requests": 1,
    "gcpause": 1,
    "topology": 2, "workload": 2, "io": 2, "caching": 2,
    "planner": 3,
    "placement": 4, "cost": 4,
    "runtime": 5,
    "cli": 6, "service": 6, "train": 6, "__main__": 6, "__init__": 6,
}


def _imports(path: Path) -> set[str]:
    """Top-level `moment.X` packages a module imports (absolute and relative imports)."""
    rel = path.relative_to(REPO).with_suffix("").parts  # ('moment', 'planner', 'lp')
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = list(rel[:-1])[: len(rel) - node.level]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
        else:
            continue
        out.update(n.split(".")[1] for n in names if n.startswith("moment.") and n.count(".") >= 1)
    return out


def test_every_package_has_a_layer():
    tops = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
            if (p.suffix == ".py") or (p.is_dir() and (p / "__init__.py").exists())}
    assert tops <= set(LAYERS), f"give these a layer in LAYERS: {sorted(tops - set(LAYERS))}"


def test_nothing_imports_upward():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("").parts
        own = LAYERS[rel[0]]
        for dep in sorted(_imports(path)):
            if dep in LAYERS and LAYERS[dep] > own:
                bad.append(f"{path.relative_to(REPO)} (layer {own}) imports moment.{dep} (layer {LAYERS[dep]})")
    assert not bad, "\n".join(bad)


def _module(path: Path) -> str:
    """`moment.placement.reader` for moment/placement/reader.py, `moment.placement` for its __init__.py."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (imports for annotations, never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
                    (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"):
                out |= {id(n) for b in node.body for n in ast.walk(b)}
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module of moment it imports: the line}, every import statement counted (at the top, in a
    function or a class; those under `if TYPE_CHECKING:` aside). `from P import x` is an import of the module
    P.x when there is one, else of P; an import of a name inside a module is an import of that module."""
    paths = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_only(tree)
        deps: dict[str, int] = {}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    up = package.split(".")
                    base = ".".join(up[: len(up) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in paths:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.setdefault(t, node.lineno)
        graph[name] = deps
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) in each strongly connected component of
    more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    cycles = []
    for comp in comps:  # a path back to the start inside the component: breadth first, so a shortest one
        start = min(comp)
        prev: dict[str, str] = {}
        todo = [start]
        while todo and start not in prev:
            nxt = []
            for v in todo:
                for w in sorted(graph[v]):
                    if w in comp and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            todo = nxt
        path = [start]
        while path[-1] != start or len(path) == 1:
            path.append(prev[path[-1]])
        cycles.append(path[::-1])
    return cycles


def test_no_module_imports_itself_through_others():
    """The import graph of moment/ has no cycle, counting imports inside functions too: a module that needs
    a name of one that needs it back holds something that belongs below both (move it there)."""
    graph = import_graph()
    assert {"moment.placement.pack", "moment.placement.manifest"} <= set(graph["moment.placement.reader"])
    assert "moment.workload.import_ogb_processed" in graph["moment.workload.import_ogb"]  # inside import_ogb()
    assert "moment.workload.graph" not in graph["moment.placement.manifest"]  # under `if TYPE_CHECKING:`
    said = []
    for cycle in import_cycles(graph):
        said.append(" -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}")
    assert not said, "import cycles:\n" + "\n".join(said)


def test_the_cycle_check_names_one_cycle_of_each_tangle():
    graph = {"a": {"b": 1}, "b": {"c": 3}, "c": {"a": 9, "d": 2}, "d": {}, "e": {"e.f": 1}, "e.f": {}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"x": {"y": 1}, "y": {}}) == []


_TRACKER = re.compile(r"\bissue\s*#?\d+|shared/papers", re.I)


def test_comments_cite_papers_not_the_tracker():
    """'issue 12' or a shared/papers path means nothing outside this project's tracker and checkout:
    cite the paper by name and section."""
    roots = [PACKAGE, REPO / "bench", REPO / "tests", REPO / "notebooks", REPO / "native", REPO / "docs",
             REPO / "topology_profiles"]
    files = [p for r in roots if r.exists() for p in r.rglob("*")
             if p.is_file() and p.suffix in {".py", ".c", ".h", ".yaml", ".md", ".ipynb", ".xml", ".js", ".html"}]
    files += [REPO / "README.md"]
    hits = [f"{p.relative_to(REPO)}:{no}: {line.strip()[:100]}"
            for p in files if p != Path(__file__)
            for no, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if _TRACKER.search(line)]
    assert not hits, "\n".join(hits)


def _thread_starts(path: Path) -> list[int]:
    """Lines of `path` that make a thread directly (`threading.Thread(...)` or `Thread(...)`)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name == "Thread":
                hits.append(node.lineno)
    return hits


def test_the_runtime_starts_threads_only_through_the_helper_that_binds_the_device():
    """A runtime thread that touches CUDA unbound runs on GPU 0 (and makes a context there in every rank):
    moment.runtime.threads.start_thread binds the rank's device first, and is the only maker of threads."""
    helper = PACKAGE / "runtime" / "threads.py"
    bare = [f"{p.relative_to(REPO)}:{no}" for p in sorted((PACKAGE / "runtime").rglob("*.py")) if p != helper
            for no in _thread_starts(p)]
    assert not bare, f"start these through moment.runtime.threads.start_thread: {bare}"
    assert _thread_starts(helper), "the helper no longer makes the thread: the check above sees nothing"
    assert _thread_starts(PACKAGE / "service" / "jobs.py"), "the pattern no longer finds a thread it should"


#: how a module says why it imports inside functions (start-up time, a torch-free path, an optional library)
LAZY_REASON = "# Imports inside functions: "


def _function_imports(tree: ast.AST) -> list[int]:
    return [s.lineno for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for s in ast.walk(f) if isinstance(s, (ast.Import, ast.ImportFrom))]


def test_a_module_that_imports_inside_functions_says_why_once():
    """Imports belong at the top; a module keeps some inside functions only where laziness is the point, and says
    so once (the reason), so a reader knows which imports may move and which must not."""
    missing, twice = [], []
    for p in sorted(PACKAGE.rglob("*.py")):
        text = p.read_text()
        if _function_imports(ast.parse(text)) and LAZY_REASON not in text:
            missing.append(p.relative_to(REPO).as_posix())
        if text.count(LAZY_REASON) > 1:
            twice.append(p.relative_to(REPO).as_posix())
    assert not missing, f"imports inside functions without the module's reason ({LAZY_REASON!r}...): {missing}"
    assert not twice, f"the reason stated more than once: {twice}"


def test_every_name_a_bench_or_example_imports_from_moment_exists():
    """The benches and examples import inside `main` (they start fast): a name moved out of a module breaks
    them only when someone runs them, so every `from moment... import name` in them is checked here."""
    import importlib

    missing = []
    for path in sorted([*(REPO / "bench").glob("*.py"), *(REPO / "examples").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "moment":
                mod = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(mod, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                        missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.module}.{alias.name}")
    assert not missing, missing
