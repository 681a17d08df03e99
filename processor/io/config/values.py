"""What a ``DUCTOR_*`` variable may hold: the parser of each kind of value, the
``ConfigError`` a value it cannot take raises (naming the variable to fix), the tier weights'
type, and how a secret is hidden (a DSN's passwords, librdkafka's secret properties)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from processor.core.scopes import parse_scope_list
from processor.io.config import kafka_properties
from processor.io.config.kafka_properties import PASSTHROUGH_PREFIX as KAFKA_PASSTHROUGH_PREFIX

# librdkafka properties can be passed through as DUCTOR_KAFKA_<PROPERTY>, with dots written as
# underscores (DUCTOR_KAFKA_SECURITY_PROTOCOL=SASL_SSL -> security.protocol=SASL_SSL).
HIDDEN = "***"  # what is shown in place of a secret


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which variable and what to do."""


@dataclass(frozen=True)
class TierWeights:
    t0: int
    t1: int
    t2: int
    delay: int

    def as_dict(self) -> dict[str, int]:
        return {"t0": self.t0, "t1": self.t1, "t2": self.t2, "delay": self.delay}


def redact_kafka(properties: Mapping[str, object]) -> dict[str, object]:
    """librdkafka properties with each secret one's value hidden (kafka_properties.is_secret)."""
    return {k: (HIDDEN if kafka_properties.is_secret(k) else v) for k, v in properties.items()}


# libpq parameters whose value is a secret: the server password and the client key's password.
_SECRET_DSN_KEYS = frozenset({"password", "sslpassword"})
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def redact_dsn(dsn: str) -> str:
    """The DSN with every password replaced, for logs and error messages.

    The DSN is read by libpq's own parser (through psycopg), so a password is found wherever
    libpq would take it from: a URI's userinfo or ``password`` query parameter, or a (possibly
    quoted) ``password=`` keyword. The result is in keyword form (``user=u password=*** ...``).
    A DSN libpq cannot parse is hidden whole, but for its URI scheme.
    """
    try:
        params = conninfo_to_dict(dsn)
        hidden = {k: ("***" if k in _SECRET_DSN_KEYS else v) for k, v in params.items()}
        return make_conninfo("", **hidden)
    except (psycopg.Error, ValueError, TypeError):
        scheme = _URI_SCHEME.match(dsn)
        return f"{scheme.group(0)}***" if scheme else "***"


def parse_int(name: str, raw: str, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name}={raw!r} must be {bound}")
    return value


def parse_float(name: str, raw: str, minimum: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not value >= minimum:  # also rejects NaN
        raise ConfigError(f"{name}={raw!r} must be >= {minimum}")
    return value


def parse_bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} must be one of true/false/1/0/yes/no/on/off")


def parse_weights(name: str, raw: str) -> TierWeights:
    parts = raw.split(":")
    if len(parts) not in (3, 4):
        raise ConfigError(f"{name}={raw!r} must look like 8:4:1 (t0:t1:t2) or 8:4:1:4 (with delay)")
    values = [parse_int(name, p, 1, 1000) for p in parts]
    delay = values[3] if len(values) == 4 else values[1]
    return TierWeights(values[0], values[1], values[2], delay)


def parse_choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    """One of ``choices``, in any case (``info`` is ``INFO``), given back as written there."""
    by_folded = {c.casefold(): c for c in choices}

    def parse(name: str, raw: str) -> str:
        choice = by_folded.get(raw.strip().casefold())
        if choice is None:
            raise ConfigError(f"{name}={raw!r} must be one of {', '.join(choices)}")
        return choice

    return parse


def parse_dsn(name: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(
            f"{name} is empty: set it to a Postgres DSN such as postgresql://user:pw@host:5432/db"
        )
    if "://" in raw and not raw.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{name}={redact_dsn(raw)!r} must start with postgresql://")
    return raw


def parse_optional_dsn(name: str, raw: str) -> str:
    """A DSN, or empty (another setting stands for it)."""
    return parse_dsn(name, raw) if raw.strip() else ""


def parse_servers(name: str, raw: str) -> str:
    servers = [s.strip() for s in raw.split(",") if s.strip()]
    if not servers:
        raise ConfigError(f"{name} is empty: set it to host:port[,host:port...]")
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"{name}: {server!r} is not host:port")
    return ",".join(servers)


def parse_name(name: str, raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", raw):
        raise ConfigError(f"{name}={raw!r} may only contain letters, digits, '.', '_' and '-'")
    return raw


def parse_optional_name(name: str, raw: str) -> str:
    """A name as ``parse_name`` reads it, or empty (none)."""
    return parse_name(name, raw) if raw else ""


def parse_session_timeout(name: str, raw: str) -> int:
    """0 (the broker's, or the client's default), or a session timeout in milliseconds."""
    value = parse_int(name, raw, 0, 1_800_000)
    if 0 < value < 1000:
        raise ConfigError(f"{name}={raw!r} must be 0 (the broker's) or at least 1000 ms")
    return value


# A host name: dot-separated labels of letters, digits and inner hyphens (RFC 1123).
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*")


def parse_host(name: str, raw: str) -> str:
    """An IPv4 or IPv6 address (without brackets) or a host name, to listen on."""
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        pass
    if len(raw) > 253 or not _HOSTNAME.fullmatch(raw):
        raise ConfigError(
            f"{name}={raw!r} is not an IP address or a host name to listen on"
            " (e.g. 127.0.0.1, 0.0.0.0, ::1)"
        )
    return raw


# The longest window DUCTOR_UI_MAX_WINDOW_S may give: a year (the page reads what it shows
# through time-ordered indexes and offsets; a search beyond is `ductor runs list`'s).
UI_WINDOW_LIMIT_S = 366 * 86400.0

_FAULT = r"[a-z_.]+=([a-z]+(@\d+)?|raise:[^,\s]+)"


def parse_faults(name: str, raw: str) -> str:
    if not re.fullmatch(rf"({_FAULT})?(,{_FAULT})*", raw):
        raise ConfigError(
            f"{name}={raw!r} must look like after_commit=kill@3 or tick=raise:RUN_ID (tests only)"
        )
    return raw


# A token a person types once; shorter ones could be guessed by trying (the page limits the
# tries, processor/ui/login_limit.py, but a long token is what makes guessing hopeless).
UI_TOKEN_MIN_LENGTH = 16


def parse_token(name: str, raw: str) -> str:
    """Empty (no token), or at least UI_TOKEN_MIN_LENGTH printable ASCII characters."""
    if raw and (len(raw) < UI_TOKEN_MIN_LENGTH or not (raw.isascii() and raw.isprintable())):
        raise ConfigError(
            f"{name} must be at least {UI_TOKEN_MIN_LENGTH} printable ASCII characters"
            " (e.g. the output of `openssl rand -hex 24`), or empty for a read-only page"
        )
    return raw


def parse_hosts(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated host names or IP addresses (an IPv6 one with or without its brackets),
    ``*.domain`` for every name under a domain, or ``*`` alone for any name: each as the Host
    header's host part is compared with it (lower case, IPv6 without brackets)."""
    hosts: list[str] = []
    for item in (part.strip().lower() for part in raw.split(",")):
        if not item:
            continue
        if item == "*":
            hosts.append(item)
            continue
        bare = item[1:-1] if item.startswith("[") and item.endswith("]") else item
        domain = bare.removeprefix("*.")
        try:
            hosts.append(str(ipaddress.ip_address(bare)))
            continue
        except ValueError:
            pass
        if len(domain) > 253 or not _HOSTNAME.fullmatch(domain):
            raise ConfigError(
                f"{name}: {item!r} is not a host name, an IP address, *.domain or *"
                " (e.g. ductor.example.com,10.0.0.5)"
            )
        hosts.append(item)
    return tuple(dict.fromkeys(hosts))


def float_in(minimum: float, maximum: float) -> Callable[[str, str], float]:
    def parse(name: str, raw: str) -> float:
        value = parse_float(name, raw, minimum)
        if value > maximum:
            raise ConfigError(f"{name}={raw!r} must be at most {maximum:g}")
        return value

    return parse


def parse_scope(kind: str) -> Callable[[str, str], tuple[str, ...] | None]:
    """A scope's list (core/scopes.py): ``*`` any, empty none, else comma-separated items."""

    def parse(name: str, raw: str) -> tuple[str, ...] | None:
        try:
            return parse_scope_list(kind, raw)
        except ValueError as exc:
            raise ConfigError(
                f"{name}={raw!r}: {exc}; write '*' (any), nothing (none) or a comma-separated list"
            ) from None

    return parse


def kafka_passthrough(env: Mapping[str, str]) -> dict[str, str]:
    """The librdkafka properties the DUCTOR_KAFKA_* variables give (whether each may be set
    is checked with the other settings: ``_check_together``)."""
    extra: dict[str, str] = {}
    for key, value in env.items():
        if key.startswith(KAFKA_PASSTHROUGH_PREFIX):
            prop = kafka_properties.property_of(key)
            if not prop:
                raise ConfigError(f"{key}: name a librdkafka property after the prefix")
            extra[prop] = value
    return extra


def int_in(minimum: int, maximum: int | None = None) -> Callable[[str, str], int]:
    return lambda n, r: parse_int(n, r, minimum, maximum)


def float_min(minimum: float) -> Callable[[str, str], float]:
    return lambda n, r: parse_float(n, r, minimum)
