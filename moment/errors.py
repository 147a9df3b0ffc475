"""The one exception type for errors a user can cause.

The CLI prints its message (no traceback) and exits non-zero, so the message must say what was wrong
and where (file, field, line).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Collection

#: what np.load raises on a missing, cut, corrupt or foreign .npy/.npz (zip members carry a CRC-32):
#: catch these to turn a bad array file into a MomentError naming it
NPZ_ERRORS = (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile)


#: how a message spells an input, given its name (`gb_per_gpu`): the CLI's option or the service's field
Flag = Callable[[str], str]


def cli_flag(name: str) -> str:
    """`gb_per_gpu` -> `--gb-per-gpu`: how the CLI spells an input."""
    return "--" + name.replace("_", "-")


def check_at_least(flag: str, value: int | None, least: int = 1) -> None:
    """An integer option below its least value (None: not given) is one line naming the flag, worded as
    every range check of the project words it."""
    if value is not None and value < least:
        raise MomentError(f"{flag} {value}: must be an integer >= {least}")


#: how to install the training extra (torch pinned as the Makefile's TORCH_PIN; tests/test_messages.py checks)
INSTALL_TRAIN = "make install-dev, or pip install -e '.[train]' torch==2.13.0"


def missing_torch(e: ModuleNotFoundError) -> MomentError | None:
    """A missing torch (or torch_geometric) as one line with the install command; None for another module."""
    top = (e.name or "").split(".")[0]
    if top not in ("torch", "torch_geometric"):
        return None
    return MomentError(f"this command needs {top} (the training extra), which is not installed", hint=INSTALL_TRAIN)


class MomentError(Exception):
    """A problem with the user's input or environment, described for a person. `field` names the input
    it is about by its plain name (`gpus`, the service's request field), so a caller can show the error
    beside that input; the message itself spells the input as the caller's `flag` does. `remedies`: the
    hint's alternatives, each by the input it changes ({"ssds": "add SSDs", ...}), so a caller that
    offers only some of those inputs (the service's page) can give only the advice it can follow."""

    def __init__(self, message: str, *, source: str | None = None, hint: str | None = None,
                 field: str | None = None, remedies: dict[str, str] | None = None):
        self.message = message
        self.source = source
        self.hint = hint
        self.field = field
        self.remedies = dict(remedies or {})
        text = f"{source}: {message}" if source else message
        if hint:
            text = f"{text}\n  hint: {hint}"
        super().__init__(text)


def validation_lines(err, *, limit: int = 8, skip: Collection[str] = (),
                     relabel: Callable[[list], list] | None = None) -> list[str]:
    """A pydantic ValidationError's errors as 'field.path: message' lines (the first `limit`, then
    '(and N more)'). `skip` drops location parts (discriminator tags); `relabel` may rewrite a location
    (e.g. a list position into the id of the node at that position)."""
    errors = err.errors()
    lines = []
    for e in errors[:limit]:
        loc = [p for p in e["loc"] if not (isinstance(p, str) and p in skip)]
        if relabel is not None:
            loc = relabel(loc)
        where = ".".join(str(p) for p in loc)
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}" if where else msg)
    if len(errors) > limit:
        lines.append(f"(and {len(errors) - limit} more)")
    return lines


def validation_error(err, what: str, *, source: str | None = None, hint: str | None = None,
                     limit: int = 8, skip: Collection[str] = (),
                     relabel: Callable[[list], list] | None = None) -> MomentError:
    """One MomentError for a pydantic ValidationError that keeps each error's field location, e.g.
    'manifest.json: invalid manifest: files.features.sha256: Field required' (one error on the line,
    several one per indented line)."""
    lines = validation_lines(err, limit=limit, skip=skip, relabel=relabel)
    body = f" {lines[0]}" if len(lines) == 1 else "\n  " + "\n  ".join(lines)
    return MomentError(f"{what}:{body}", source=source, hint=hint)
