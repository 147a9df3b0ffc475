"""`moment serve`: the placement service over HTTP (moment.service), started with uvicorn."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import typer

from moment.cli import app, err_console
from moment.errors import MomentError

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.


@app.command("serve")
def serve_cmd(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on; anything but loopback needs a token"),
    port: int = typer.Option(8000, "--port", help="TCP port"),
    data_dir: Path = typer.Option(Path("moment-data"), "--data-dir", "-d",
                                  help="the only directory requests may touch: datasets/, layouts/, probe/ and the job database"),
    token: str | None = typer.Option(None, "--token", envvar="MOMENT_TOKEN", show_envvar=True,
                                     help="bearer token every /v1 route but health requires (prefer the env variable: "
                                          "arguments show in `ps`)"),
    allow_no_token: bool = typer.Option(
        False, "--allow-no-token", envvar="MOMENT_ALLOW_NO_TOKEN", show_envvar=True,
        help="serve other machines without a token: only behind a reverse proxy that authenticates them"),
    allowed_hosts: list[str] = typer.Option(
        [], "--allowed-host", envvar="MOMENT_ALLOWED_HOSTS", show_envvar=True,
        help="without a token, a Host name served besides localhost, 127.0.0.1 and [::1] (repeat it; the variable "
             "takes them comma-separated): what a reverse proxy in front forwards as Host"),
    db: Path | None = typer.Option(None, "--db", help="SQLite job database (default DATA_DIR/jobs.sqlite3)"),
    workers: int = typer.Option(1, "--workers", help="worker processes (they share the job database)"),
    root_path: str = typer.Option("", "--root-path", help="URL prefix a reverse proxy serves the app under, e.g. /moment"),
    forwarded_allow_ips: str = typer.Option(
        "127.0.0.1", "--forwarded-allow-ips",
        help="proxies whose X-Forwarded-For/-Proto headers are trusted (comma-separated, or '*')"),
    max_body_mib: float = typer.Option(16, "--max-body-mib", help="largest request body (413 above)"),
    max_upload_mib: float = typer.Option(8, "--max-upload-mib", help="largest uploaded machine description (413 above)"),
    plan_timeout: float = typer.Option(120, "--plan-timeout", help="seconds one plan/compare/simulate may search (408 after)"),
    body_timeout: float = typer.Option(30, "--body-timeout",
                                       help="longest pause in a request body, in seconds (408 after; the whole "
                                            "body may take 10 times it)"),
    request_max_mib: int = typer.Option(4096, "--request-max-mib",
                                        help="memory of one request's worker process (the cluster plan; 413 above)"),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn's log level"),
) -> None:
    """Serve the planner over HTTP: JSON under /v1 (plan, compare, simulate, scan, profiles, models, and place/probe jobs), the OpenAPI schema at /openapi.json, and the web page at / when installed.

    Example: moment serve --port 8000 --data-dir ./moment-data, then curl -s localhost:8000/v1/plan -H 'content-type: application/json' -d '{"profile": "paper-machine-b", "gpus": 4, "ssds": 8}'

    Safe by default: it listens on 127.0.0.1 only. Listening on another address needs a token (--token or MOMENT_TOKEN); clients then send `Authorization: Bearer TOKEN`. The app applies the same rule to every connection however it was started (uvicorn --factory, gunicorn): without a token it answers 403 to a connection that reached a non-loopback address, unless --allow-no-token (MOMENT_ALLOW_NO_TOKEN=1) says a proxy in front authenticates the clients. Without a token it also answers 403 to a request whose Host header is not localhost, 127.0.0.1 or [::1] (any port), so a web page whose name was pointed at 127.0.0.1 cannot drive it (DNS rebinding); --allowed-host NAME serves another name.

    Slow clients: a connection must send a request's headers within 20 s and its body without a pause over --body-timeout (408 after), and the process keeps at most half its file-descriptor limit (ulimit -n) in open connections (503 at once past it).

    Behind a reverse proxy (nginx, Caddy, Traefik): keep --host 127.0.0.1 and proxy to it (without a token, pass the name it forwards as Host with --allowed-host, or have it send Host: localhost); set --forwarded-allow-ips to the proxy's address so its X-Forwarded-For/-Proto headers are trusted, and --root-path /PREFIX when the proxy serves the app under a path prefix (and strips it). Let the proxy terminate TLS; its own body limit should not be below --max-body-mib.

    Several workers: --workers N starts N uvicorn processes. Any ASGI server can run the app from the MOMENT_DATA_DIR, MOMENT_TOKEN, MOMENT_DB, MOMENT_MAX_BODY_MIB, MOMENT_MAX_UPLOAD_MIB, MOMENT_PLAN_TIMEOUT_S, MOMENT_BODY_TIMEOUT_S, MOMENT_ALLOWED_HOSTS and MOMENT_REQUEST_MAX_MIB variables, e.g. `MOMENT_DATA_DIR=/srv/moment uvicorn --factory moment.service.app:create_app --workers 4` or `gunicorn -k uvicorn.workers.UvicornWorker -w 4 'moment.service.app:create_app()'`. The workers share the jobs through the one SQLite file: any worker shows or cancels any job, each job runs in the worker that accepted it, and a job whose worker died is marked interrupted.
    """
    from moment.service.config import ENV, MiB, Settings, check_bind

    check_bind(host, token, allow_no_token)
    if workers < 1:
        raise MomentError(f"--workers {workers}: at least 1")
    if not 0 < port < 65536:
        raise MomentError(f"--port {port}: choose 1-65535")
    for flag, value in (("--max-body-mib", max_body_mib), ("--max-upload-mib", max_upload_mib),
                        ("--plan-timeout", plan_timeout), ("--body-timeout", body_timeout),
                        ("--request-max-mib", request_max_mib)):
        if not (math.isfinite(value) and value > 0):  # (NaN passed a `<= 0` test and every plan timed out at once)
            raise MomentError(f"{flag} {value}: must be a finite number above 0")
    if root_path and not root_path.startswith("/"):
        raise MomentError(f"--root-path {root_path!r}: a URL path begins with /", hint=f"--root-path /{root_path}")
    try:
        import fastapi  # noqa: F401
        import uvicorn
        from uvicorn.config import LOG_LEVELS
    except ImportError as e:
        raise MomentError(f"the service needs {e.name}: pip install 'moment[serve]'") from None
    if log_level.lower() not in LOG_LEVELS:
        raise MomentError(f"--log-level {log_level!r}: choose one of {', '.join(LOG_LEVELS)}")
    hosts = [h for given in allowed_hosts for h in given.split(",") if h.strip()]  # the variable's commas too
    settings = Settings(data_dir=data_dir, db=db, token=token, allow_no_token=allow_no_token, allowed_hosts=tuple(hosts),
                        max_body_bytes=int(max_body_mib * MiB), max_upload_bytes=int(max_upload_mib * MiB),
                        plan_timeout_s=plan_timeout, body_timeout_s=body_timeout,
                        request_max_mib=request_max_mib).checked()  # the paths first: a busy port hides nothing
    _check_port_free(host, port)
    from moment.service.server import PROTOCOL

    common = dict(host=host, port=port, root_path=root_path, proxy_headers=True, http=PROTOCOL,
                  forwarded_allow_ips=forwarded_allow_ips, log_level=log_level.lower())
    if workers == 1:
        from moment.service.app import create_app

        service = create_app(settings)  # opens the job database: a damaged one is refused before the line below
        _announce(host, port, root_path, settings, allow_no_token)
        uvicorn.run(service, **common)
        return
    from moment.service.jobs import JobStore

    JobStore(settings.db_path)  # each worker opens it; refused here, a damaged one stops them all at once
    _announce(host, port, root_path, settings, allow_no_token)
    # the workers are new processes: they build the app from the environment
    os.environ.update({ENV["data_dir"]: str(settings.data_dir), ENV["max_body_mib"]: str(max_body_mib),
                       ENV["max_upload_mib"]: str(max_upload_mib), ENV["plan_timeout_s"]: str(plan_timeout),
                       ENV["body_timeout_s"]: str(body_timeout), ENV["request_max_mib"]: str(request_max_mib),
                       ENV["allowed_hosts"]: ",".join(settings.allowed_hosts)})
    if db is not None:
        os.environ[ENV["db"]] = str(db)
    if settings.token:
        os.environ[ENV["token"]] = settings.token
    if allow_no_token:
        os.environ[ENV["allow_no_token"]] = "1"
    uvicorn.run("moment.service.app:create_app", factory=True, workers=workers, **common)


def _announce(host: str, port: int, root_path: str, settings, allow_no_token: bool) -> None:
    auth = ("bearer token required" if settings.token else
            "no token: other machines allowed (--allow-no-token)" if allow_no_token else "no token: loopback only")
    err_console.print(f"moment service on http://{host}:{port}{root_path}/ (data {settings.data_dir}; {auth})",
                      highlight=False)


def _check_port_free(host: str, port: int) -> None:
    """Say so in one line when the address is taken, before uvicorn logs its own error and exits 3."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            import errno

            hint = ("another process holds the port: pick another --port" if e.errno == errno.EADDRINUSE
                    else "--host must be an address of this machine")
            raise MomentError(f"--host {host} --port {port}: cannot listen there ({e.strerror})", hint=hint) from None
