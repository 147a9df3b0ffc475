"""Limits on request bodies: their size (413), enforced on the declared length and on the bytes actually
sent, and their pace (408): a body must keep arriving, with no pause over `timeout_s` and all of it
within BODY_TIMEOUTS times that, so a client that sends half a body and waits holds no connection for good.

A client sends its whole body before it reads the answer (urllib, requests, curl): closing on unread
bytes resets its connection, so it never sees the 413. The rest of the body is read and dropped
first, within DRAIN_S seconds and DRAIN_BYTES bytes (past those the connection is closed: a body that
large or that slow is not a client waiting for an answer)."""

from __future__ import annotations

import asyncio
import json
import time

from moment.service.errors import log

DRAIN_S = 10.0
DRAIN_BYTES = 1 << 30
#: a whole body may take this many body timeouts to arrive (a slow link sends, but keeps sending)
BODY_TIMEOUTS = 10
#: seconds between two log lines about connections the process could not accept
ACCEPT_LOG_EVERY_S = 60.0


class BodyLimit:
    """Pure ASGI middleware: a body over `limit` bytes is answered 413 before the app parses it, one that
    stops arriving for `timeout_s` (or takes BODY_TIMEOUTS times that) 408; the app then sees the
    client gone and whatever it answers is dropped."""

    def __init__(self, app, limit: int, timeout_s: float = 30.0):
        self.app, self.limit, self.timeout_s = app, limit, timeout_s

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
        over = ended = late = started = False
        deadline = time.monotonic() + BODY_TIMEOUTS * self.timeout_s

        async def counted():
            # past the limit the app is told the body ended; whatever it answers is replaced by the 413
            nonlocal seen, over, ended, late
            if over:
                return {"type": "http.request", "body": b"", "more_body": False}
            if late:
                return {"type": "http.disconnect"}
            if ended:  # the whole body is in: what is left to hear is the client going away, whenever
                return await receive()
            wait = min(self.timeout_s, deadline - time.monotonic())
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.0))
            except TimeoutError:
                late = True
                if not started:
                    await answer(send, 408, self._late(seen, wait < self.timeout_s))
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                ended = not message.get("more_body", False)
                if seen > self.limit:
                    over = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        replaced = False

        async def watched(message):
            nonlocal replaced, started
            if late:  # answered 408 already (or the answer had begun: the connection is cut short)
                return
            if not over:
                started = True
                await send(message)
            elif not replaced and message["type"] == "http.response.start":
                replaced = True
                if not ended:  # past its last part, receive() would wait for the client to go away: DRAIN_S
                    await drain(receive)
                await answer(send, 413, self._message(seen, at_least=True))

        await self.app(scope, counted, watched)

    def _late(self, seen: int, whole: bool) -> str:
        why = (f"did not arrive within {BODY_TIMEOUTS * self.timeout_s:g} s" if whole else
               f"stopped arriving: nothing for {self.timeout_s:g} s")
        return f"the request body {why} ({seen:,} bytes received); send it whole, without pauses"

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


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """One log line a minute, with a count, while the process cannot accept connections (out of file
    descriptors: EMFILE), where asyncio logged a traceback for each try, up to the listen backlog's
    length each time the socket polled ready: hundreds of megabytes of log in a minute. Other errors go
    to the handler there was."""
    previous = loop.get_exception_handler()
    last, missed = -ACCEPT_LOG_EVERY_S, 0

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        nonlocal last, missed
        if context.get("message") != "socket.accept() out of system resource":
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - last < ACCEPT_LOG_EVERY_S:
            missed += 1
            return
        again = f" ({missed} more times since the last such line)" if missed else ""
        log.error("moment: cannot accept connections: %s%s; they wait in the listen queue until one closes (said "
                  "once a minute at most)", context.get("exception"), again)
        last, missed = now, 0

    loop.set_exception_handler(handler)
