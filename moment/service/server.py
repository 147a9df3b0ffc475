"""How `moment serve` runs uvicorn: its HTTP/1.1 protocol (h11) with two guards uvicorn lacks, so that
slow or idle clients cannot hold the service's connections (and file descriptors) for good.

- A deadline on request headers: a connection must send a request's headers within HEADER_S seconds
  of opening (or of the previous answer), else it is closed. uvicorn times out only the pause between
  requests, and only until the first byte of the next one. (The body's pace is limits.BodyLimit's.)
- A cap on open connections (connection_cap: half the process's file-descriptor limit, the other half
  left to the jobs, the database and the workers): a connection past it gets a 503 at once and is
  closed, so the process never runs out of descriptors for accepting (see limits.quiet_accept_errors).

Another ASGI server (`uvicorn --factory`, gunicorn) keeps the body limits but not these: give it its own
(`--limit-concurrency`, a proxy's timeouts).
"""

from __future__ import annotations

import json

try:
    import resource
except ImportError:  # not on this system (Windows)
    resource = None

from uvicorn.protocols.http.h11_impl import H11Protocol

#: what `moment serve` gives uvicorn as its `http` protocol
PROTOCOL = f"{__name__}:Guarded"
#: seconds a connection may take to send a request's headers
HEADER_S = 20.0


def connection_cap() -> int:
    """Connections one server process keeps open: half its soft file-descriptor limit (`ulimit -n`)."""
    if resource is None:
        return 1000
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(8, (soft if soft != resource.RLIM_INFINITY else 1 << 20) // 2)


def _full(cap: int) -> bytes:
    body = json.dumps({"detail": f"the service has {cap:,} connections open, as many as it keeps (half its "
                                 "file-descriptor limit, `ulimit -n`); try again shortly"}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 5\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


class Guarded(H11Protocol):
    """uvicorn's h11 protocol with the header deadline and the connection cap (module docstring)."""

    _headers_due = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = connection_cap()
        if len(self.connections) > cap:  # this one included: answer without reading it, and let it go
            transport.write(_full(cap))
            transport.close()
            return
        self._await_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start the next pipelined request
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        """Close the connection if no request has begun (its headers read) within HEADER_S from now."""
        if self._headers_due is not None:
            self._headers_due.cancel()
        cycle = self.cycle  # the request answered last (None: none yet), or one already begun

        def late() -> None:
            idle = self.cycle is cycle and (cycle is None or cycle.response_complete)
            if idle and not self.transport.is_closing():
                self.transport.close()

        self._headers_due = self.loop.call_later(HEADER_S, late)
