"""Names in requests, never paths: a dataset, layout or probe directory is a name under its folder of the
data directory, and must stay inside it once symlinks are followed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from moment.service.errors import FieldError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def inside(root: Path, folder: str, name: str, field: str, *, must_exist: bool = False) -> Path:
    """ROOT/FOLDER/NAME for a plain name (letters, digits, '.', '_', '-'; no '..'), refused when it
    resolves outside ROOT/FOLDER (a symlink pointing away) or, with `must_exist`, is not a directory."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise FieldError(field, f"{name!r} is not a plain name (letters, digits, '.', '_', '-'; no paths, no '..')")
    base = (root / folder).resolve()
    path = root / folder / name
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        raise FieldError(field, f"{name!r} cannot be resolved inside the data directory") from None
    if real == base or not real.is_relative_to(base):
        raise FieldError(field, f"{name!r} leads outside {folder}/ of the data directory (a symlink?)")
    if must_exist and not path.is_dir():
        raise FieldError(field, f"no {folder.rstrip('s')} named {name!r} in {folder}/ of the data directory")
    return path


def relative(value: Any, root: Path) -> Any:
    """`value` (a job's result, error or notice: text, or JSON-like data) with every path inside `root`
    written relative to it, so answers never show where the server keeps its data."""
    if isinstance(value, str):
        return "." if value == str(root) else value.replace(f"{root}/", "")
    if isinstance(value, dict):
        return {k: relative(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [relative(v, root) for v in value]
    return value
