"""JSON for any /v1 request no route takes, rather than the page's 404: registered after every router."""

from fastapi import FastAPI, Request
from starlette.routing import Match

from moment.service.errors import JSON, error
from moment.service.methods import allowed_methods

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def add_fallback(app: FastAPI) -> None:
    """Route every other /v1 path and method of `app` to `unknown`."""
    app.add_api_route("/v1/{rest:path}", unknown, methods=METHODS, include_in_schema=False)


async def unknown(rest: str, request: Request) -> JSON:
    """A 405 naming the methods when the path is a route's (this catch-all would otherwise hide that),
    else a 404."""
    routes = [r for r in request.app.router.routes if getattr(r, "endpoint", None) is not unknown
              and r.matches(request.scope)[0] == Match.PARTIAL]  # the path matches, the method not
    allowed = allowed_methods([m for m in ("GET", "POST", "PUT", "PATCH", "DELETE")
                               if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes)])
    if allowed:
        return JSON({"detail": f"{request.method} is not allowed on /v1/{rest}; use {', '.join(allowed)}"},
                    status_code=405, headers={"Allow": ", ".join(allowed)})
    return error(404, f"no route /v1/{rest}; see /openapi.json")
