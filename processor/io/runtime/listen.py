"""The one error of a server that cannot listen (the health and metrics endpoints, the web
page of `ductor ui`): a configuration error, reported as one sentence that names the setting
to change."""

from __future__ import annotations

import errno

_SETTING = {"health": "DUCTOR_HEALTH_PORT", "metrics": "DUCTOR_METRICS_PORT", "ui": "--port"}
# Where the address comes from: the health and metrics servers share a setting; the web page
# has a flag of its own (a host opened to probes must not open the page).
_HOST_SETTING = {"ui": "--host"}


class ListenError(Exception):
    """``what`` (health, metrics or ui) could not listen on ``host``:``port``."""

    def __init__(self, what: str, host: str, port: int, cause: OSError) -> None:
        self.what, self.host, self.port = what, host, port
        setting = _SETTING.get(what, "the port")
        host_setting = _HOST_SETTING.get(what, "DUCTOR_HTTP_HOST")
        if cause.errno == errno.EADDRINUSE:
            why = f"something else listens there: stop it or set {setting} to a free port"
        elif cause.errno == errno.EACCES:
            why = f"this user may not listen on it: set {setting} above 1023"
        elif cause.errno == errno.EADDRNOTAVAIL:
            why = f"no interface of this machine has that address: check {host_setting}"
        else:
            why = f"{cause.strerror or cause}: check {setting} and {host_setting}"
        address = f"[{host}]" if ":" in host else host
        super().__init__(f"the {what} endpoint cannot listen on {address}:{port}; {why}")
