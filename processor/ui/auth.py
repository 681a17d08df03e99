"""Who may press the web page's buttons (pure: the clock is an argument).

The page is read-only unless a token is configured (``DUCTOR_UI_TOKEN``). A person types the
token once into the login form; the page then sets a session cookie that proves it was given:
``v1.<issued, epoch seconds>.<HMAC-SHA256 keyed by the token over the issue time>``. The
cookie does not hold the token, expires after SESSION_S, and every session ends when the token
changes. Comparisons are constant-time (both sides hashed first, so not even the length of the
token leaks).

Cross-site requests: the cookie is ``SameSite=Strict`` and ``HttpOnly`` and the actions are
POSTs only, so another site can neither send the cookie nor read it; a POST that says it comes
from another origin is refused besides (``same_origin``).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

COOKIE = "ductor_ui_session"
SESSION_S = 12 * 3600
# A session issued this far in the future is taken as the server's clock stepping back, not
# as forged (forging one needs the token anyway).
_CLOCK_SLACK_S = 300
_VERSION = "v1"


def _equal(a: str, b: str) -> bool:
    return hmac.compare_digest(
        hashlib.sha256(a.encode()).digest(), hashlib.sha256(b.encode()).digest()
    )


def token_matches(configured: str, given: str) -> bool:
    """Whether ``given`` is the token; never when none is configured."""
    return bool(configured) and _equal(configured, given)


def _mac(token: str, issued_s: int) -> str:
    message = f"ductor-ui-session:{_VERSION}:{issued_s}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def new_session(token: str, now_s: int) -> str:
    """The cookie value of a session that starts now."""
    return f"{_VERSION}.{now_s}.{_mac(token, now_s)}"


def session_valid(token: str, cookie: str | None, now_s: int) -> bool:
    """Whether ``cookie`` is a session this token issued and that has not expired."""
    if not token or not cookie:
        return False
    version, _, rest = cookie.partition(".")
    issued, _, mac = rest.partition(".")
    if version != _VERSION or not issued.isdigit() or len(issued) > 12:
        return False
    issued_s = int(issued)
    if not issued_s - _CLOCK_SLACK_S <= now_s < issued_s + SESSION_S:
        return False
    return _equal(mac, _mac(token, issued_s))


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether a POST's ``Origin`` header names the page's own host (the ``Host`` header).
    A request without Origin passes: browsers send one with every cross-site POST, and the
    SameSite cookie is the defence against those that do not."""
    if origin is None:
        return True
    if origin == "null" or host is None:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of this site only (never ``//other.site``)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
