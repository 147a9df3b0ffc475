"""HEAD answered as GET without the body on every route that takes GET (RFC 9110 section 9.3.2): FastAPI
routes take only the methods they name, so `HEAD /v1/profiles` was a 405 whose `Allow` left HEAD out."""

from __future__ import annotations


class HeadAsGet:
    """Pure ASGI middleware: a HEAD request runs as GET, and the answer's body is dropped (its headers,
    Content-Length included, are the GET's)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def bodiless(message):
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, bodiless)


def allowed_methods(methods: list[str]) -> list[str]:
    """The methods an `Allow` header lists for a path whose routes take `methods`: HEAD beside GET."""
    if "GET" in methods and "HEAD" not in methods:
        methods = [*methods[:methods.index("GET") + 1], "HEAD", *methods[methods.index("GET") + 1:]]
    return methods
