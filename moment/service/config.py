"""The service's settings: where its data lives, who may call it, and how much one request may cost."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from moment.errors import MomentError
from moment.outputs import check_output, reason

MiB = 1 << 20

#: environment variables the `--factory` entry point reads (what `moment serve` sets for its workers)
ENV = {"data_dir": "MOMENT_DATA_DIR", "db": "MOMENT_DB", "token": "MOMENT_TOKEN",
       "allow_no_token": "MOMENT_ALLOW_NO_TOKEN", "max_body_mib": "MOMENT_MAX_BODY_MIB",
       "max_upload_mib": "MOMENT_MAX_UPLOAD_MIB", "plan_timeout_s": "MOMENT_PLAN_TIMEOUT_S",
       "request_max_mib": "MOMENT_REQUEST_MAX_MIB", "body_timeout_s": "MOMENT_BODY_TIMEOUT_S",
       "allowed_hosts": "MOMENT_ALLOWED_HOSTS"}


@dataclass(frozen=True)
class Settings:
    """`data_dir`: every file a request may name lives under it (datasets/, layouts/, probe/);
    `db`: the SQLite job store (default DATA_DIR/jobs.sqlite3); `token`: when set, every /v1 route but
    health needs `Authorization: Bearer TOKEN`; `allow_no_token`: serve other machines without a token
    (only behind a proxy that authenticates them; see check_bind); `allowed_hosts`: Host names served
    without a token besides the loopback ones (see check_host)."""

    data_dir: Path
    db: Path | None = None
    token: str | None = None
    allow_no_token: bool = False
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = 16 * MiB
    max_upload_bytes: int = 8 * MiB
    plan_timeout_s: float = 120.0
    #: the longest pause in a request body (408 after; the whole body gets limits.BODY_TIMEOUTS times it)
    body_timeout_s: float = 30.0
    #: address space of a request's worker process (the cluster plan runs in one): past it, 413
    request_max_mib: int = 4096
    #: scratch file a probe job may write per SSD directory, and in all its directories together
    probe_max_mib: int = 4096
    probe_max_job_mib: int = 16384
    job_workers: int = 1
    #: jobs waiting to start, over all the service's processes (more are answered 429)
    max_queued_jobs: int = 16
    #: plan/compare/simulate/advise searches running at once, and how many more may wait for a slot
    #: (within their time limit); past both a search is answered 429 at once
    max_searches: int = max(1, os.cpu_count() or 1)
    max_waiting_searches: int = 2 * max(1, os.cpu_count() or 1)

    @property
    def db_path(self) -> Path:
        return self.db if self.db is not None else self.data_dir / "jobs.sqlite3"

    def checked(self) -> Settings:
        """The data directory made (and resolved), the limits sane; a bad setting is a MomentError."""
        hosts = tuple(host_names(self.allowed_hosts))
        d = Path(self.data_dir).expanduser()
        if d.resolve() == Path(d.resolve().anchor):  # every file a request names must lie under it
            raise MomentError("the data directory cannot be the file system's root: requests could name any file",
                              source=str(d), hint="give a directory of its own, e.g. --data-dir ./moment-data")
        check_output(d, "the data directory", directory=True)  # a file, a dangling link, a name too long
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MomentError(f"cannot create the data directory: {reason(e)}", source=str(d)) from None
        if self.max_waiting_searches < 0:
            raise MomentError(f"max_waiting_searches must not be negative (got {self.max_waiting_searches})")
        for name in ("max_body_bytes", "max_upload_bytes", "plan_timeout_s", "body_timeout_s", "probe_max_mib",
                     "probe_max_job_mib", "request_max_mib", "job_workers", "max_queued_jobs", "max_searches"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):  # NaN is not > 0 either
                raise MomentError(f"{name} must be positive (got {getattr(self, name)})")
        db = None
        if self.db is not None:
            db = check_output(Path(self.db).expanduser(), "the job database").resolve()
        return replace(self, data_dir=d.resolve(), db=db, token=self.token or None, allowed_hosts=hosts)

    @classmethod
    def from_env(cls) -> Settings:
        """Settings from MOMENT_* variables (the `uvicorn --factory moment.service.app:create_app` path)."""
        env = os.environ

        def num(key: str, default: float) -> float:
            text = env.get(ENV[key])
            if text is None:
                return default
            try:
                return float(text)
            except ValueError:
                raise MomentError(f"{ENV[key]}={text!r}: expected a number") from None

        data_dir = env.get(ENV["data_dir"])
        if not data_dir:
            raise MomentError(f"set {ENV['data_dir']} to the service's data directory")
        return cls(data_dir=Path(data_dir), db=Path(env[ENV["db"]]) if env.get(ENV["db"]) else None,
                   token=env.get(ENV["token"]) or None, allow_no_token=env_flag(ENV["allow_no_token"]),
                   max_body_bytes=int(num("max_body_mib", 16) * MiB),
                   max_upload_bytes=int(num("max_upload_mib", 8) * MiB),
                   plan_timeout_s=num("plan_timeout_s", 120.0), body_timeout_s=num("body_timeout_s", 30.0),
                   request_max_mib=int(num("request_max_mib", 4096)),
                   allowed_hosts=tuple(h for h in env.get(ENV["allowed_hosts"], "").split(",") if h.strip())).checked()


def env_flag(name: str) -> bool:
    """A yes/no environment variable, spelled as `moment serve`'s options read it (click's booleans)."""
    text = os.environ.get(name, "").strip().lower()
    if text in ("", "0", "false", "f", "no", "n", "off"):
        return False
    if text in ("1", "true", "t", "yes", "y", "on"):
        return True
    raise MomentError(f"{name}={os.environ[name]!r}: expected 1 or 0")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`: the only addresses served without a token."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, allow_no_token: bool = False, *, what: str | None = None) -> None:
    """The one rule on who is served: without a token, only this machine (a loopback address), unless
    `allow_no_token` says a proxy in front authenticates the others. `moment serve` asks it of --host
    before it listens; the app asks it of every connection's local address (see access.LocalOnly), so
    an ASGI server started on 0.0.0.0 without `moment serve` is refused too. `what` names the address
    in the message (default: `--host HOST`)."""
    if token or allow_no_token or is_loopback(host):
        return
    what = what or f"--host {host}"
    raise MomentError(f"{what}: refusing to serve a non-loopback address without a token (pass --token or set "
                      f"{ENV['token']}; or bind 127.0.0.1 behind a reverse proxy; or set "
                      f"{ENV['allow_no_token']}=1 when that proxy authenticates the clients)")


def host_name(header: str) -> str:
    """The name in a Host header, lower case, without its port, brackets or final dot ('[::1]:8000' -> '::1')."""
    h = header.strip().lower()
    if h.startswith("[") and "]" in h:
        h = h[1:h.index("]")]
    elif h.count(":") == 1:
        h = h.partition(":")[0]
    return h.rstrip(".")


def host_names(given) -> list[str]:
    """--allowed-host values (MOMENT_ALLOWED_HOSTS) as check_host compares them; a MomentError names one
    that is not a host name (a URL, a port, a space)."""
    out = []
    for h in given:
        name = h.strip()
        if name != "*" and not re.fullmatch(r"[A-Za-z0-9_.-]{1,253}|\[[0-9A-Fa-f:.]+\]", name):
            raise MomentError(f"--allowed-host {h!r}: expected a host name such as moment.example.org (no scheme "
                              f"or port), or * for any ({ENV['allowed_hosts']} takes them comma-separated)")
        out.append(host_name(name))
    return out


def check_host(header: str | None, s: Settings) -> None:
    """The rule against DNS rebinding: a service without a token answers only requests that name it by a
    loopback name (localhost, 127.0.0.1, [::1], any port) or by one of `s.allowed_hosts`, so a web page
    whose own name has been pointed at 127.0.0.1 cannot drive it from the user's browser (browsers send
    the page's name as Host). A token (which such a page cannot know) or `allow_no_token` (a proxy in
    front answers for the clients) lifts it; a request without a Host header came from no browser."""
    if s.token or s.allow_no_token or header is None:
        return
    name = host_name(header)
    if is_loopback(name) or name in s.allowed_hosts or "*" in s.allowed_hosts:
        return
    raise MomentError(f"Host {header!r}: without a token the service answers only requests naming it localhost, "
                      f"127.0.0.1 or [::1], so that a web page whose name points here cannot drive it (DNS "
                      f"rebinding); open it as http://localhost:PORT/, or allow the name with --allowed-host "
                      f"{name or 'NAME'} ({ENV['allowed_hosts']}), or give a token")
