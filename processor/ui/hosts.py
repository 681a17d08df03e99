"""Which names the web page answers to (pure): a request whose ``Host`` header names another
host is refused before any page is read.

Why: a page of another site whose name its owner makes resolve to this server's address (DNS
rebinding: ``evil.example`` first at the attacker's address, then at 127.0.0.1 or 10.0.0.5)
is, for the browser, of the same origin as everything ``evil.example`` serves: its scripts
could read our pages. They cannot change the ``Host`` header the browser sends, which still
says ``evil.example``, so a server that answers only to its own names is out of their reach.
This holds on loopback too: 127.0.0.1 is exactly what rebinding aims at.

The names served: ``DUCTOR_UI_ALLOWED_HOSTS`` if set (``*`` alone turns the check off, for a
proxy in front that checks it); otherwise the address the page is bound to, and this
machine's loopback names when that is a loopback address. Bound to every interface (0.0.0.0,
::) the page has no name of its own to default to: the setting must say them.
"""

from __future__ import annotations

import ipaddress

from processor.io.config.values import ConfigError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
ANY_HOST = "*"


def served_hosts(bound: str, configured: tuple[str, ...], loopback: bool) -> tuple[str, ...]:
    """The names a page bound to ``bound`` answers to (see the module's rules); ConfigError
    for an address of every interface without the setting."""
    if configured:
        return configured
    name = _normal(bound)
    try:
        unspecified = ipaddress.ip_address(name).is_unspecified
    except ValueError:
        unspecified = False
    if unspecified:
        raise ConfigError(
            f"ductor ui --host {bound} listens on every interface, so it has no name of its own"
            " to answer to: set DUCTOR_UI_ALLOWED_HOSTS to the names and addresses browsers"
            " reach it by (e.g. ductor.example.com,10.0.0.5), or * if a proxy in front checks"
            " the Host header"
        )
    names = [name, *LOOPBACK_HOSTS] if loopback else [name]
    return tuple(dict.fromkeys(names))


def host_of(header: str | None) -> str | None:
    """The host part of a ``Host`` header: lower case, without its port, an IPv6 address
    without its brackets, a trailing dot dropped (``localhost.`` is ``localhost``); None
    for a header that names no host."""
    if not header:
        return None
    text = header.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
    else:
        host, colon, port = text.partition(":")
        if colon and not port.isdigit():
            return None  # a second colon (an IPv6 address needs brackets) or no port number
    host = _normal(host.removesuffix("."))
    return host or None


def host_allowed(header: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether a request whose ``Host`` header is ``header`` is one the page answers:
    its host is one of ``allowed``, or under a ``*.domain`` of them, or ``allowed`` is ``*``."""
    if ANY_HOST in allowed:
        return True
    host = host_of(header)
    if host is None:
        return False
    for name in allowed:
        if host == name or (name.startswith("*.") and host.endswith(name[1:])):
            return True
    return False


def _normal(host: str) -> str:
    bare = host.strip().lower().removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return bare
