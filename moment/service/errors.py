"""The service's error answers: bad input 422 (naming the field), too big 413, too slow 408, too many
searches at once 429, the job database out of reach 503; never a 500."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

from starlette.responses import JSONResponse

from moment.errors import MomentError
from moment.requests import TRUTH_VALUE
from moment.service.schemas import ErrorBody

#: what the service logs beside its answers (the job database failing, refused connections)
log = logging.getLogger("moment.service")


def request_field(name: str) -> str:
    """How the library's messages name an input here: the request field itself (the CLI says `--name`)."""
    return name


#: inputs a COUNTxMODEL inventory replaces: what the library blames on them is the inventory's
INVENTORY_INPUTS = ("gpus", "ssds", "gpu_model", "ssd_model", "inventory")


def given_beside_inventory(req, names: tuple[str, ...] = INVENTORY_INPUTS[:-1]) -> dict[str, object]:
    """The counts and models a request set itself (not left at their defaults), for
    `check_one_inventory`: with an inventory they would be ignored, as `moment plan --inventory` says."""
    return {k: getattr(req, k) if k in req.model_fields_set else None for k in names}


@contextmanager
def blame(field: str | None, *, instead_of: Collection[str] = ()) -> Iterator[None]:
    """A MomentError raised inside is about request field `field`: one that names no input (a reader of
    an upload), or one that names an input of `instead_of` (the planner's `gpus` where the request gave
    an `inventory`). `field` None: no change."""
    try:
        yield
    except MomentError as e:
        if field is not None and (e.field is None or e.field in instead_of):
            e.field = field
        if field is not None and instead_of:  # the hint's advice on those inputs is advice on `field`
            e.remedies = {(field if k in instead_of else k): v for k, v in e.remedies.items()}
        raise


class FieldError(MomentError):
    """Bad input in one request field; the message starts with the field's name."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}", field=field)


class TooLarge(Exception):
    """A body or upload over its limit (413)."""


class Busy(Exception):
    """No free search slot within the time limit (429: try again later)."""


class TimedOut(Exception):
    """A search that ran past the per-request time limit (408)."""


class Unavailable(Exception):
    """The job database cannot be read or written (a full disk, a lost mount): 503, try again later."""


def _finite(x: Any) -> Any:
    """inf/NaN (never valid JSON) as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


class JSON(JSONResponse):
    """JSONResponse that writes a non-finite float as null instead of failing with a 500."""

    def render(self, content: Any) -> bytes:
        try:
            text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except ValueError:
            text = json.dumps(_finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8")


_ERRORS = {
    401: "missing or wrong bearer token (when the service has one)",
    403: "no token, and the connection came from beyond this machine (see `moment serve --help`)",
    404: "no such route or job",
    405: "the route does not take this method (`Allow` lists those it takes)",
    408: "the search ran past the service's time limit",
    413: "the body or an upload is over the service's size limit",
    422: "bad input: `errors` names each request field (`body`: the body could not be read)",
    429: "too many searches or waiting jobs at once; try again after `Retry-After` seconds",
    503: "the job database cannot be read or written (a full disk?); try again after `Retry-After` seconds",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, each with the ErrorBody schema."""
    return {s: {"description": _ERRORS[s], "model": ErrorBody} for s in statuses}


def error(status: int, detail: str, **extra: Any) -> JSON:
    return JSON({"detail": detail, **extra}, status_code=status)


#: the most errors a 422 lists (a body of 1.3 million unknown keys was answered with 82 MB of them); the rest are
#: counted
MAX_ERRORS = 20
#: the type of the error that stands for those left out, `ctx["more"]` of them (moment.service.body)
MORE_ERRORS = "more_errors"
#: the most of them `detail` spells out
_DETAIL_LINES = 8


def validation_detail(errors: list[dict]) -> tuple[str, list[dict]]:
    """FastAPI's request errors as one line naming each field ('gpus: Input should be ...') and a list: the
    first MAX_ERRORS, then one saying how many more."""
    out, more = [], 0
    for e in errors:
        if e.get("type") == MORE_ERRORS:
            more += e["ctx"]["more"]
            continue
        if e.get("type") == "json_invalid":  # loc is ("body", offset)
            out.append({"field": "body", "message": f"not valid JSON at character {e['loc'][-1]}: "
                                                     f"{e.get('ctx', {}).get('error', 'decode error')}"})
            continue
        loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path", "form")]
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        if e.get("type") == TRUTH_VALUE:  # a model's rule about one of its fields: name that field
            inner = e["ctx"]["field"]
            loc, msg = [*loc, inner], msg.removeprefix(f"{inner}: ")
        field = ".".join(loc) or "body"
        out.append({"field": field, "message": msg})
    more += max(0, len(out) - MAX_ERRORS)
    out = out[:MAX_ERRORS]
    lines = [f"{x['field']}: {x['message']}" for x in out[:_DETAIL_LINES]]
    if len(out) + more > _DETAIL_LINES:
        lines.append(f"(and {len(out) + more - _DETAIL_LINES:,} more)")
    if more:
        out.append({"field": "body", "message": f"(and {more:,} more errors not listed)"})
    return "; ".join(lines) or "invalid request", out
