"""`ductor ui`'s server: the application (app.py) served by uvicorn on a socket bound here
first, so an address in use or not of this machine is a configuration error named at start
(io/listen.ListenError, exit 2) rather than a log line of a server that then exits."""

from __future__ import annotations

import ipaddress
import logging
import socket

import uvicorn

from processor.io.config import Settings
from processor.io.listen import ListenError
from processor.ui.app import create_app

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
        try:
            self.sock = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise ListenError("ui", host, port, exc) from None
        self.host, self.port = host, self.sock.getsockname()[1]
        self.actions = bool(settings.ui_token)
        loopback = is_loopback(host)
        config = uvicorn.Config(
            create_app(settings, loopback),
            log_config=None,  # the process's own logging (io/logs.py), JSON or text
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
        log.info("ui serving", extra={"url": self.url, "actions": actions})
        self._server.run(sockets=[self.sock])

    def stop(self) -> None:
        self._server.should_exit = True

    def _warn(self, settings: Settings, loopback: bool) -> None:
        if loopback:
            return
        log.warning(
            "ui serving beyond this machine: whoever reaches %s reads every run's ids, tags,"
            " errors and outputs; serve it behind TLS and a proxy that authenticates",
            self.host,
        )
        if settings.ui_token:
            log.warning(
                "ui: the token and its session cookie cross the network in clear over plain HTTP"
            )
