"""A route's inputs read before FastAPI reads them: the checks it does not make, off the event loop.

FastAPI parses and validates a JSON body on the event loop (a 15.8 MB body of unknown keys held every
request, health included, for 13 s and answered 82 MB of errors), keeps the last of a key given twice,
says "Input should be a valid dictionary" of a JSON body sent without its content type, and ignores a
query parameter the route does not declare (`POST /v1/plan?gpus=8` planned the body's). `JsonRoute`,
the route class of the service's routers, refuses those with a 422 naming the input, and parses and
validates a JSON body itself (a body FastAPI then reads again is a valid one: cheap): a large one in a
thread of its own pool, as the searches hold the shared worker threads (a request waiting for one of
those would not be told 429 at once, moment.service.deps).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import params
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from moment.service.deps import check_token
from moment.service.errors import MAX_ERRORS, MORE_ERRORS

#: a body up to this size is read on the event loop (well under a millisecond); a larger one by _READERS
ON_LOOP_BYTES = 1 << 16
_READERS = ThreadPoolExecutor(2, thread_name_prefix="moment-body")


class JsonRoute(APIRoute):
    """A route whose query parameters are the ones it declares, and whose JSON body (a pydantic model)
    is sent as JSON, has no key twice and no unknown key, and is parsed and validated off the event loop; for
    a client with the service's token (`check_token`) only: each router of this class is under /v1's check."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        queries = frozenset(_query_names(self.dependant))
        model = _body_model(self)

        async def checked(request: Request) -> Response:
            # the token first (every route of this class is under /v1's token check): a client without it is not read
            scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
            check_token(request.app.state.settings, credentials.strip() if scheme.lower() == "bearer" else None)
            unknown = [k for k in dict.fromkeys(request.query_params.keys()) if k not in queries]
            if unknown:
                raise RequestValidationError([_query_error(k, model) for k in unknown])
            if model is not None:
                try:
                    data = await request.body()
                except ClientDisconnect:  # gone, or answered 408 (limits.BodyLimit): nobody hears an answer
                    return Response(status_code=499)
                if data:
                    _check_content_type(request.headers.get("content-type"))
                    parsed = (_read(data, model) if len(data) <= ON_LOOP_BYTES else
                              await asyncio.get_running_loop().run_in_executor(_READERS, _read, data, model))
                    if parsed is not _UNREAD:  # FastAPI reads it as the route's body: the same value
                        request._json = parsed  # what Request.json() caches
            return await handler(request)

        return checked


def _query_names(dependant: Dependant) -> list[str]:
    """The query parameters a route (its handler and dependencies) declares."""
    return [p.alias for p in dependant.query_params] + [n for d in dependant.dependencies for n in _query_names(d)]


def _body_model(route: APIRoute) -> type[BaseModel] | None:
    """The model of a route's JSON body (None: no body, or a form)."""
    field = route.body_field
    if field is None or isinstance(field.field_info, params.Form):
        return None
    kind = field.field_info.annotation
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def _query_error(name: str, model: type[BaseModel] | None) -> dict[str, Any]:
    in_body = model is not None and name in _keys(model)
    msg = "give it in the JSON body, not the query string" if in_body else "the route takes no such query parameter"
    return {"type": "query_unknown", "loc": ("query", name), "msg": msg, "input": None}


def _check_content_type(value: str | None) -> None:
    """A body is read as JSON only when it says it is (FastAPI's rule): say so rather than 'not an object'."""
    kind = (value or "").partition(";")[0].strip().lower()
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        return
    got = f"got {value}" if value else "no Content-Type header was sent"
    raise RequestValidationError([{"type": "content_type", "loc": ("body",), "input": None,
                     "msg": f"send JSON with the header Content-Type: application/json ({got})"}])


#: the most values (numbers, strings, lists, objects...) a body may hold: the largest, a plan of a 16-GPU machine
#: posted back to /v1/simulate, holds about 2,000. It bounds the errors a body can cause (3 million bad items in
#: one list took 2 s of validation and 16 s and 2.6 GB to list their errors).
MAX_VALUES = 100_000

#: a body FastAPI should read itself (not JSON, not UTF-8, nested too deep): its own errors name the cause
_UNREAD = object()


def _read(data: bytes, model: type[BaseModel]) -> Any:
    """The body parsed, checked for keys given twice, unknown keys and its size, and validated as `model`
    (in a worker thread); the errors past the first MAX_ERRORS only counted."""
    twice: list[tuple[str, dict]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) < len(items) and not twice:
            seen: set[str] = set()
            twice.append((next(k for k, _ in items if k in seen or seen.add(k)), obj))
        return obj

    try:
        value = json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return _UNREAD
    if twice:
        key, obj = twice[0]
        where = ("body", key) if obj is value else ("body",)  # a field of the request, or a key deeper in it
        said = "appears twice in the body" if obj is value else f"key {key!r} appears twice in one object"
        raise RequestValidationError([{"type": "duplicate_key", "loc": where, "input": None,
                         "msg": f"{said} (give it once: a JSON reader keeps only the last)"}])
    if not isinstance(value, dict):
        return value  # FastAPI says what the body should be
    if model.model_config.get("extra") == "forbid":
        keys = _keys(model)
        unknown = [k for k in value if k not in keys]
        if unknown:
            errors = [{"type": "extra_forbidden", "loc": ("body", k), "msg": "Extra inputs are not permitted",
                       "input": None} for k in unknown[:MAX_ERRORS]]
            raise RequestValidationError(errors + _more(len(unknown) - MAX_ERRORS))
    if _count(value, MAX_VALUES) > MAX_VALUES:
        raise RequestValidationError([{"type": "too_many_values", "loc": ("body",), "input": None,
                         "msg": f"more than {MAX_VALUES:,} values (numbers, strings, lists, objects): no request "
                                "holds that many"}])
    try:
        model.model_validate(value)
    except ValidationError as e:
        errors = e.errors(include_url=False, include_input=False)
        raise RequestValidationError([{**x, "loc": ("body", *x["loc"])} for x in errors[:MAX_ERRORS]]
                       + _more(len(errors) - MAX_ERRORS)) from None
    return value


def _count(value: Any, limit: int) -> int:
    """How many values `value` holds, itself included, counting no further than past `limit`."""
    n, todo = 0, [value]
    while todo and n <= limit:
        v = todo.pop()
        n += 1
        if isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
    return n


def _keys(model: type[BaseModel]) -> set[str]:
    """The keys a body of `model` may have: its fields' names and aliases."""
    return {k for name, f in model.model_fields.items() for k in (name, f.alias or name)}


def _more(n: int) -> list[dict[str, Any]]:
    """The errors left out past the first MAX_ERRORS, as one that says how many (moment.service.errors)."""
    return [{"type": MORE_ERRORS, "loc": ("body",), "msg": "", "input": None, "ctx": {"more": n}}] if n > 0 else []
