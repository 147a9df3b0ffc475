"""A limit on request bodies (413), enforced on the declared length and on the bytes actually sent."""

from __future__ import annotations

import json

from moment.service.errors import TooLarge


class BodyLimit:
    """Pure ASGI middleware: a body over `limit` bytes is answered 413 before the app parses it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await _answer(send, 400, "Content-Length is not a number")
                return
            if size > self.limit:
                await _answer(send, 413, self._message(size))
                return
        seen = 0
        started = False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise TooLarge(self._message(seen, at_least=True))
            return message

        async def watched(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except TooLarge as e:
            if started:
                raise
            await _answer(send, 413, str(e))

    def _message(self, size: int, at_least: bool = False) -> str:
        return (f"the request body is {'more than ' if at_least else ''}{size:,} bytes; the service's limit is "
                f"{self.limit:,}")


async def _answer(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
