"""`ductor ui`'s server: the application (app.py) served by uvicorn on a socket bound here
first, so an address in use or not of this machine is a configuration error named at start
(io/listen.ListenError, exit 2) rather than a log line of a server that then exits."""

from __future__ import annotations

import ipaddress
import logging
import socket

import uvicorn

from processor.io.config.settings import Settings
from processor.io.runtime.listen import ListenError
from processor.ui.app import create_app
from processor.ui.hosts import ANY_HOST, served_hosts

log = logging.getLogger("ductor.ui")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class UiServer:
    """The page served on ``host``:``port`` (0: a free port) until ``stop``."""

    def __init__(self, settings: Settings, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        loopback = is_loopback(host)
        # Before the socket: a wildcard address without the names to answer to is exit 2.
        self.hosts = served_hosts(host, settings.ui_allowed_hosts, loopback)
        try:
            self.sock = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise ListenError("ui", host, port, exc) from None
        self.host, self.port = host, self.sock.getsockname()[1]
        self.actions = bool(settings.ui_token)
        self.read_token_required = settings.ui_read_token_required
        config = uvicorn.Config(
            create_app(settings, self.hosts),
            log_config=None,  # the process's own logging (io/telemetry/logs.py), JSON or text
            access_log=False,  # the actions are logged by the page itself, with the run
            lifespan="off",
            server_header=False,
            proxy_headers=False,  # nothing in front is trusted to say who the client is
        )
        self._server = uvicorn.Server(config)
        # Its start and stop lines say what "ui serving" says; its errors still show.
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        self._warn(settings, loopback)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def run(self) -> None:
        """Serve until ``stop`` (or a SIGTERM or SIGINT, which uvicorn takes while it runs)."""
        actions = "retry and cancel with the token" if self.actions else "off (read-only)"
        reading = "with the token" if self.read_token_required else "open"
        log.info(
            "ui serving",
            extra={
                "url": self.url,
                "api": f"{self.url}api/openapi.json",
                "actions": actions,
                "reading": reading,
                "hosts": ",".join(self.hosts),
            },
        )
        self._server.run(sockets=[self.sock])

    def stop(self) -> None:
        self._server.should_exit = True

    def _warn(self, settings: Settings, loopback: bool) -> None:
        if ANY_HOST in self.hosts:
            log.warning(
                "ui: DUCTOR_UI_ALLOWED_HOSTS is *: the page answers to any Host header, so only"
                " a proxy in front that checks it keeps DNS-rebinding pages out"
            )
        if loopback:
            return
        if not settings.ui_read_token_required:
            log.warning(
                "ui serving beyond this machine: whoever reaches %s reads every run's ids, tags,"
                " errors and outputs; set DUCTOR_UI_READ_TOKEN_REQUIRED, or serve it behind a"
                " proxy that authenticates",
                self.host,
            )
        if settings.ui_token:
            log.warning(
                "ui: the token and its session cookie cross the network in clear over plain HTTP"
            )
