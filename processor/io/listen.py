"""The one error of a server that cannot listen (the health and metrics endpoints): a
configuration error, reported as one sentence that names the setting to change."""

from __future__ import annotations

import errno

_SETTING = {"health": "DUCTOR_HEALTH_PORT", "metrics": "DUCTOR_METRICS_PORT"}


class ListenError(Exception):
    """``what`` (health or metrics) could not listen on ``host``:``port``."""

    def __init__(self, what: str, host: str, port: int, cause: OSError) -> None:
        self.what, self.host, self.port = what, host, port
        setting = _SETTING.get(what, "the port")
        if cause.errno == errno.EADDRINUSE:
            why = f"something else listens there: stop it or set {setting} to a free port"
        elif cause.errno == errno.EACCES:
            why = f"this user may not listen on it: set {setting} above 1023"
        elif cause.errno == errno.EADDRNOTAVAIL:
            why = "no interface of this machine has that address: check DUCTOR_HTTP_HOST"
        else:
            why = f"{cause.strerror or cause}: check {setting} and DUCTOR_HTTP_HOST"
        address = f"[{host}]" if ":" in host else host
        super().__init__(f"the {what} endpoint cannot listen on {address}:{port}; {why}")
