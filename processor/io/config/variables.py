"""Every ``DUCTOR_*`` variable any part of Ductor reads: one per setting (with its parser,
the one table ``load_settings`` and ``settings_env`` are built from), the secrets that may come
from a file, those other programs read; the refusal of a name nothing reads, and the secrets
read from their files."""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Callable, Mapping

from processor.core.scopes import format_scope_list
from processor.io.config import kafka_properties
from processor.io.config.kafka_properties import PASSTHROUGH_PREFIX as KAFKA_PASSTHROUGH_PREFIX
from processor.io.config.values import (
    UI_WINDOW_LIMIT_S,
    ConfigError,
    TierWeights,
    float_in,
    float_min,
    int_in,
    parse_bool,
    parse_choice,
    parse_dsn,
    parse_faults,
    parse_host,
    parse_hosts,
    parse_name,
    parse_optional_dsn,
    parse_optional_name,
    parse_scope,
    parse_servers,
    parse_session_timeout,
    parse_token,
    parse_weights,
)

# Every setting but kafka_extra, with the parser of its DUCTOR_<FIELD> variable. Both
# load_settings and settings_env are built from this one table, so they cannot drift apart.
FIELDS: tuple[tuple[str, Callable[[str, str], object]], ...] = (
    ("bootstrap_servers", parse_servers),
    ("group_id", parse_name),
    ("group_protocol", parse_choice(("consumer", "classic"))),
    ("pg_dsn", parse_dsn),
    ("worker_pg_dsn", parse_optional_dsn),
    ("topic_prefix", parse_name),
    ("wakeup_partitions", int_in(1, 10_000)),
    ("delay_partitions", int_in(1, 10_000)),
    ("step_partitions", int_in(1, 10_000)),
    ("dlq_partitions", int_in(1, 10_000)),
    ("replication_factor", int_in(0, 32)),
    ("min_insync_replicas", int_in(0, 32)),
    ("batch_size", int_in(1, 100_000)),
    ("batch_linger_ms", int_in(0, 10_000)),
    ("tier_weights", parse_weights),
    ("tier_buffer_limit", int_in(1, 10_000_000)),
    ("livelock_requeues", int_in(1, 1000)),
    ("stuck_after_s", float_min(1.0)),
    ("sweep_interval_s", float_min(0.05)),
    ("sweep_grace_s", float_min(0.0)),
    ("sweep_limit", int_in(1, 1_000_000)),
    ("relay_after_s", float_min(0.5)),
    ("kept_signal_ttl_s", float_min(1.0)),
    ("requests_workflows", parse_scope("workflows")),
    ("requests_run_id_prefixes", parse_scope("run_id_prefixes")),
    ("requests_signals", parse_scope("signals")),
    ("trigger_refresh_s", float_min(0.1)),
    ("instance_timeout_s", float_min(1.0)),
    ("partition_by_run", parse_bool),
    ("max_record_bytes", int_in(256, 100 * 1024 * 1024)),
    ("shutdown_timeout_s", float_min(0.5)),
    ("log_format", parse_choice(("json", "text"))),
    ("log_level", parse_choice(("DEBUG", "INFO", "WARNING", "ERROR"))),
    ("metrics_port", int_in(0, 65535)),
    ("stats_log_interval_s", float_min(0.5)),
    ("health_port", int_in(0, 65535)),
    ("http_host", parse_host),
    ("health_stall_s", float_min(0.1)),
    ("group_stall_s", float_min(0.0)),
    ("worker_name", parse_optional_name),
    ("worker_session_timeout_ms", parse_session_timeout),
    ("test_faults", parse_faults),
    ("test_clock_ahead_ms", int_in(-86_400_000, 86_400_000)),
    ("ui_token", parse_token),
    ("ui_allowed_hosts", parse_hosts),
    ("ui_read_token_required", parse_bool),
    ("ui_window_s", float_in(60.0, UI_WINDOW_LIMIT_S)),
    ("ui_max_window_s", float_in(60.0, UI_WINDOW_LIMIT_S)),
)


def variable(field_name: str) -> str:
    return f"DUCTOR_{field_name.upper()}"


def format_value(value: object) -> str:
    """A setting's value written the way its parser reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, TierWeights):
        return f"{value.t0}:{value.t1}:{value.t2}:{value.delay}"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    if value is None or isinstance(value, tuple):  # a scope's or a host list: None is any
        return format_scope_list(value)
    return str(value)


# -- names: every DUCTOR_* variable any part of Ductor reads -----------------------------------

SETTING_VARIABLES: tuple[str, ...] = tuple(variable(name) for name, _ in FIELDS)

# The settings whose value is a secret: never shown or logged whole, and each may be read from
# a file named by <VARIABLE>_FILE instead (a mounted Kubernetes or Docker secret).
SECRET_VARIABLES: tuple[str, ...] = (
    "DUCTOR_PG_DSN",
    "DUCTOR_WORKER_PG_DSN",
    "DUCTOR_UI_TOKEN",
    *sorted(kafka_properties.variable_for(p) for p in kafka_properties.SECRET_PROPERTIES),
)
FILE_SUFFIX = "_FILE"

# DUCTOR_* variables read by other programs than the ``ductor`` command, which must not be
# refused when they share its environment: name -> who reads it.
READ_ELSEWHERE: Mapping[str, str] = {
    "DUCTOR_INFRA": "infra/local.py (local or docker) and the tests",
    "DUCTOR_INFRA_DIR": "infra/local.py (where the local services live)",
    "DUCTOR_LOCAL_KAFKA_PORT": "infra/local.py and infra/compose.yaml",
    "DUCTOR_LOCAL_KAFKA_CONTROLLER_PORT": "infra/local.py",
    "DUCTOR_LOCAL_KAFKA_SASL_PORT": "infra/local.py",
    "DUCTOR_LOCAL_KAFKA_BROKERS": "infra/local.py",
    "DUCTOR_LOCAL_PG_PORT": "infra/local.py and infra/compose.yaml",
    # At import: the pure-Python modules instead of the compiled ones; at build: a pure wheel.
    "DUCTOR_PURE_PYTHON": "processor/__init__.py (at import) and setup.py (at build)",
    # `make test`: the build each test run must be on, and where it built the wheel.
    "DUCTOR_EXPECT_BUILD": "the tests (tests/unit/test_build.py), set by the Makefile",
    "DUCTOR_TEST_DIST": "the tests (tests/integration/background_builds.py), set by the Makefile",
    # The database the tests' and the chaos run's step modules count executions in.
    "DUCTOR_TEST_EXECUTION_LOG": "the tests' and the chaos run's steps (tools/chaos_steps.py)",
}

KNOWN_VARIABLES: frozenset[str] = frozenset(
    {*SETTING_VARIABLES, *(v + FILE_SUFFIX for v in SECRET_VARIABLES), *READ_ELSEWHERE}
)
# Any name with this prefix is a librdkafka property (the client itself refuses one it does
# not know, when the command creates it).
KNOWN_PREFIXES: tuple[str, ...] = (KAFKA_PASSTHROUGH_PREFIX,)


def is_known_variable(name: str) -> bool:
    return name in KNOWN_VARIABLES or name.startswith(KNOWN_PREFIXES)


def check_names(env: Mapping[str, str]) -> None:
    """Refuse the ``DUCTOR_*`` names nothing reads (a misspelt setting would otherwise be
    ignored without a word), each with the nearest known name."""
    unknown = sorted(k for k in env if k.startswith("DUCTOR_") and not is_known_variable(k))
    if not unknown:
        return
    known = {v.removeprefix("DUCTOR_"): v for v in KNOWN_VARIABLES}
    clauses = []
    for name in unknown:
        # Compared without the prefix every name shares, which would make any two look alike.
        close = difflib.get_close_matches(name.removeprefix("DUCTOR_"), sorted(known), n=1)
        hint = f" (did you mean {known[close[0]]}?)" if close else ""
        clauses.append(f"{name} is not a setting of Ductor{hint}")
    raise ConfigError("; ".join(clauses) + "; `ductor config show` lists the settings")


# -- secrets from files -------------------------------------------------------------------------


def _strip_newline(text: str) -> str:
    """A file's content without its one trailing newline (``echo secret > file`` adds one)."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def with_secret_files(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with each ``<SECRET>_FILE`` replaced by ``<SECRET>`` holding the file's content."""
    resolved = dict(env)
    for var in SECRET_VARIABLES:
        file_var = var + FILE_SUFFIX
        path = resolved.pop(file_var, None)
        if path is None:
            continue
        if var in env:
            raise ConfigError(f"{var} and {file_var} are both set: keep one of them")
        try:
            with open(path, encoding="utf-8") as f:
                resolved[var] = _strip_newline(f.read())
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"{file_var}={path!r} cannot be read: {why}") from None
    return resolved


def secret_file_warnings(env: Mapping[str, str] | None = None) -> list[str]:
    """A sentence for each ``<SECRET>_FILE`` that users other than its owner may read (its
    group or everyone): whoever shares the machine or the volume can read the secret. Warned,
    not refused (a file the process cannot stat is load_settings' refusal)."""
    given = os.environ if env is None else env
    warnings: list[str] = []
    for var in SECRET_VARIABLES:
        path = given.get(var + FILE_SUFFIX)
        if path is None:
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        readers = [
            w for w, bit in (("its group", stat.S_IRGRP), ("others", stat.S_IROTH)) if mode & bit
        ]
        if readers:
            warnings.append(
                f"{var}{FILE_SUFFIX}={path!r} is readable by {' and '.join(readers)}"
                f" (mode {stat.S_IMODE(mode):04o}): make it readable by its owner only"
                " (chmod 600, or a secret volume's defaultMode)"
            )
    return warnings
