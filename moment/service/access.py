"""Who may connect: the bind rule of `moment serve` (config.check_bind) applied to each connection, so
an app started by any ASGI server (`uvicorn --factory ... --host 0.0.0.0`) without a token answers
only this machine."""

from __future__ import annotations

import ipaddress

from moment.errors import MomentError
from moment.service.config import Settings, check_bind
from moment.service.limits import answer


class LocalOnly:
    """Pure ASGI middleware: a connection that reached a non-loopback address of this machine gets a 403
    unless the settings have a token (then the token check decides) or allow it.

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
            except MomentError as e:
                await answer(send, 403, str(e))
                return
        await self.app(scope, receive, send)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True
