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
