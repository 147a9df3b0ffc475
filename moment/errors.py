"""The one exception type for errors a user can cause.

The CLI prints its message (no traceback) and exits non-zero, so the message must say what was wrong
and where (file, field, line).
"""

from __future__ import annotations


class MomentError(Exception):
    """A problem with the user's input or environment, described for a person."""

    def __init__(self, message: str, *, source: str | None = None, hint: str | None = None):
        self.source = source
        self.hint = hint
        text = f"{source}: {message}" if source else message
        if hint:
            text = f"{text}\n  hint: {hint}"
        super().__init__(text)


def validation_message(err, *, limit: int = 1, sep: str = "; ", skip: frozenset[str] = frozenset()) -> str:
    """A pydantic ValidationError as `field.path: message` items (the first `limit`, then "and N more"),
    so every reader of a schema says which field is wrong. `skip`: location parts to leave out
    (discriminator tags of tagged unions)."""
    errs = err.errors()
    items = []
    for e in errs[:limit]:
        loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p in skip))
        msg = str(e["msg"]).removeprefix("Value error, ")
        items.append(f"{loc}: {msg}" if loc else msg)
    more = f"{sep}(and {len(errs) - limit} more)" if len(errs) > limit else ""
    return sep.join(items) + more
