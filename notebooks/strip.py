"""Strip outputs from notebooks before committing: `python notebooks/strip.py [--check] [FILE.ipynb ...]`.

Notebooks are kept in git without outputs, execution counts or run metadata, so diffs show only what a
person wrote (tests/test_notebooks.py checks it; it also executes them). No arguments: every notebook in
this folder. `--check`: change nothing, list the notebooks that are not stripped and exit 1 if any.
Plain json, written the way nbformat writes it, so it needs no Jupyter package.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

RUN_METADATA = ("execution", "collapsed", "scrolled")  # per-cell keys a run or a viewer adds


def stripped(nb: dict) -> dict:
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        for key in RUN_METADATA:
            cell.get("metadata", {}).pop(key, None)
    return nb


def dumps(nb: dict) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def strip_file(path: Path, check: bool = False) -> bool:
    """True when `path` was (or, with check, would be) changed."""
    text = path.read_text(encoding="utf-8")
    new = dumps(stripped(json.loads(text)))
    if new == text:
        return False
    if not check:  # atomic: a crash leaves the old file or the new one
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new)
        os.replace(tmp, path)
    return True


def main(argv: list[str]) -> int:
    check = "--check" in argv
    files = [Path(a) for a in argv if a != "--check"] or sorted(Path(__file__).parent.glob("*.ipynb"))
    changed = [p for p in files if strip_file(p, check)]
    for p in changed:
        print(f"{p}: {'not stripped' if check else 'stripped'}")
    return 1 if (check and changed) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
