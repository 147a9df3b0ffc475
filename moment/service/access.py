"""Who may connect: the bind rule of `moment serve` (config.check_bind) applied to each connection, so
an app started by any ASGI server (`uvicorn --factory ... --host 0.0.0.0`) without a token answers
only this machine, and the Host rule (config.check_host), so that a web page in this machine's browser
cannot drive it through DNS rebinding."""

from __future__ import annotations

import ipaddress

from moment.errors import MomentError
from moment.service.config import Settings, check_bind, check_host
from moment.service.limits import answer


class LocalOnly:
    """Pure ASGI middleware: a connection that reached a non-loopback address of this machine gets a 403
    unless the settings have a token (then the token check decides) or allow it; so does a request over
    TCP whose Host is not a name check_host takes.

    The ASGI scope's `server` is the socket's local address: an IP for TCP (the address the client
    connected to, so a server bound to 0.0.0.0 still tells a local client from a remote one), None or a
    path for a Unix socket, and the URL's host for in-process clients; only an IP can be remote."""

    def __init__(self, app, settings: Settings):
        self.app, self.settings = app, settings

    async def __call__(self, scope, receive, send):
        server = scope.get("server") if scope["type"] == "http" else None
        host = str(server[0]) if server else ""
        if _is_ip(host):
            try:
                check_bind(host, self.settings.token, self.settings.allow_no_token,
                           what=f"this connection reached {host}")
                check_host(_header(scope, b"host"), self.settings)
            except MomentError as e:
                await answer(send, 403, str(e))
                return
        await self.app(scope, receive, send)


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k == name:
            return v.decode("latin-1")
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True
