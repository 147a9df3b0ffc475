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
    "outputs": 1, "sizes": 1, "locking": 1, "testpoints": 1, "inputs": 1, "documents": 1,
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
