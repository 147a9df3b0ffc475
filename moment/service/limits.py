"""A limit on request bodies (413), enforced on the declared length and on the bytes actually sent.

A client sends its whole body before it reads the answer (urllib, requests, curl): closing on unread
bytes resets its connection, so it never sees the 413. The rest of the body is read and dropped
first, within DRAIN_S seconds and DRAIN_BYTES bytes (past those the connection is closed: a body that
large or that slow is not a client waiting for an answer)."""

from __future__ import annotations

import asyncio
import json
import time

DRAIN_S = 10.0
DRAIN_BYTES = 1 << 30


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
                await answer(send, 400, "Content-Length is not a number")
                return
            if size > self.limit:
                await drain(receive)
                await answer(send, 413, self._message(size))
                return
        seen = 0
        over = ended = False

        async def counted():
            # past the limit the app is told the body ended; whatever it answers is replaced by the 413
            nonlocal seen, over, ended
            if over:
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    over, ended = True, not message.get("more_body", False)
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        replaced = False

        async def watched(message):
            nonlocal replaced
            if not over:
                await send(message)
            elif not replaced and message["type"] == "http.response.start":
                replaced = True
                if not ended:  # past its last part, receive() would wait for the client to go away: DRAIN_S
                    await drain(receive)
                await answer(send, 413, self._message(seen, at_least=True))

        await self.app(scope, counted, watched)

    def _message(self, size: int, at_least: bool = False) -> str:
        got = f"{size:,} bytes received so far" if at_least else f"{size:,} bytes"
        return f"the request body is over the service's limit of {self.limit:,} bytes ({got})"


async def drain(receive) -> None:
    """Read and drop what is left of the request body (module docstring), so the answer reaches the client."""
    end = time.monotonic() + DRAIN_S
    got = 0
    while got <= DRAIN_BYTES:
        left = end - time.monotonic()
        if left <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), left)
        except TimeoutError:
            return
        if message["type"] != "http.request":
            return  # the client went away
        got += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def answer(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
