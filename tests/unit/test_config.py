"""Settings from an environment mapping and back (processor/io/config/settings.py)."""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.io.config.kafka_properties import property_of, refusal
from processor.io.config.settings import Settings, load_settings, settings_env
from processor.io.config.values import ConfigError, TierWeights, redact_dsn

from .strategies import FAST


def test_defaults() -> None:
    settings = load_settings({})
    assert settings == Settings()
    assert settings.bootstrap_servers == "127.0.0.1:19092"
    assert settings.topic_prefix == "ductor"
    assert settings.tier_weights == TierWeights(8, 4, 1, 4)
    assert settings.tier_weights.as_dict() == {"t0": 8, "t1": 4, "t2": 1, "delay": 4}
    assert settings.livelock_requeues == 8
    assert settings.partition_by_run is True
    assert settings.kafka_extra == {}
    assert settings.kafka_common() == {"bootstrap.servers": "127.0.0.1:19092"}
    assert (
        settings.pg_dsn_redacted
        == "user=ductor password=*** dbname=ductor host=127.0.0.1 port=55432"
    )


def test_unrelated_variables_are_ignored() -> None:
    assert load_settings({"PATH": "/bin", "DUCTOR": "x", "ductor_batch_size": "1"}) == Settings()


def test_valid_values_are_parsed() -> None:
    env = {
        "DUCTOR_BOOTSTRAP_SERVERS": " k1:9092, k2:9093 ,",
        "DUCTOR_GROUP_ID": "group-1",
        "DUCTOR_PG_DSN": "postgres://u:p@db:5432/x",
        "DUCTOR_TOPIC_PREFIX": "dx.test_1",
        "DUCTOR_WAKEUP_PARTITIONS": "12",
        "DUCTOR_DELAY_PARTITIONS": "12",
        "DUCTOR_BATCH_LINGER_MS": "0",
        "DUCTOR_TIER_WEIGHTS": "5:3:2",
        "DUCTOR_STUCK_AFTER_S": "1.5",
        "DUCTOR_SWEEP_GRACE_S": "0",
        "DUCTOR_PARTITION_BY_RUN": " Off ",
        "DUCTOR_LOG_FORMAT": "text",
        "DUCTOR_LOG_LEVEL": "DEBUG",
        "DUCTOR_METRICS_PORT": "65535",
        "DUCTOR_MAX_RECORD_BYTES": "256",
    }
    s = load_settings(env)
    assert s.bootstrap_servers == "k1:9092,k2:9093"
    assert s.group_id == "group-1"
    assert s.pg_dsn == "postgres://u:p@db:5432/x"
    assert s.topic_prefix == "dx.test_1"
    assert s.wakeup_partitions == 12
    assert s.batch_linger_ms == 0
    assert s.tier_weights == TierWeights(5, 3, 2, 3)  # delay defaults to t1's weight
    assert s.stuck_after_s == 1.5
    assert s.sweep_grace_s == 0.0
    assert s.partition_by_run is False
    assert (s.log_format, s.log_level, s.metrics_port) == ("text", "DEBUG", 65535)
    assert s.max_record_bytes == 256
    assert load_settings({"DUCTOR_TIER_WEIGHTS": "1:2:3:4"}).tier_weights == TierWeights(1, 2, 3, 4)
    assert load_settings({"DUCTOR_PG_DSN": "host=db dbname=x"}).pg_dsn == "host=db dbname=x"


@pytest.mark.parametrize("raw", ["1", "true", "YES", "on", "0", "false", "No", "OFF"])
def test_booleans(raw: str) -> None:
    expected = raw.lower() in {"1", "true", "yes", "on"}
    assert load_settings({"DUCTOR_PARTITION_BY_RUN": raw}).partition_by_run is expected


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("DUCTOR_BOOTSTRAP_SERVERS", ""),
        ("DUCTOR_BOOTSTRAP_SERVERS", " , "),
        ("DUCTOR_BOOTSTRAP_SERVERS", "kafka"),
        ("DUCTOR_BOOTSTRAP_SERVERS", "kafka:port"),
        ("DUCTOR_BOOTSTRAP_SERVERS", ":9092"),
        ("DUCTOR_GROUP_ID", ""),
        ("DUCTOR_GROUP_ID", "my group"),
        ("DUCTOR_PG_DSN", ""),
        ("DUCTOR_PG_DSN", "   "),
        ("DUCTOR_PG_DSN", "mysql://u:secret@h/db"),
        ("DUCTOR_TOPIC_PREFIX", "a/b"),
        ("DUCTOR_TOPIC_PREFIX", "x" * 201),
        ("DUCTOR_WAKEUP_PARTITIONS", "0"),
        ("DUCTOR_WAKEUP_PARTITIONS", "six"),
        ("DUCTOR_DELAY_PARTITIONS", "10001"),
        ("DUCTOR_STEP_PARTITIONS", "-1"),
        ("DUCTOR_DLQ_PARTITIONS", "1.5"),
        ("DUCTOR_REPLICATION_FACTOR", "33"),
        ("DUCTOR_BATCH_SIZE", "0"),
        ("DUCTOR_BATCH_LINGER_MS", "-1"),
        ("DUCTOR_TIER_WEIGHTS", "8:4"),
        ("DUCTOR_TIER_WEIGHTS", "8:4:1:4:1"),
        ("DUCTOR_TIER_WEIGHTS", "8:0:1"),
        ("DUCTOR_TIER_WEIGHTS", "8:4:x"),
        ("DUCTOR_TIER_WEIGHTS", "1001:1:1"),
        ("DUCTOR_TIER_BUFFER_LIMIT", "0"),
        ("DUCTOR_LIVELOCK_REQUEUES", "0"),
        ("DUCTOR_LIVELOCK_REQUEUES", "1001"),
        ("DUCTOR_STUCK_AFTER_S", "0.5"),
        ("DUCTOR_STUCK_AFTER_S", "nan"),
        ("DUCTOR_STUCK_AFTER_S", "soon"),
        ("DUCTOR_SWEEP_INTERVAL_S", "0.01"),
        ("DUCTOR_SWEEP_GRACE_S", "-0.1"),
        ("DUCTOR_SWEEP_LIMIT", "0"),
        ("DUCTOR_PARTITION_BY_RUN", "maybe"),
        ("DUCTOR_PARTITION_BY_RUN", ""),
        ("DUCTOR_MAX_RECORD_BYTES", "255"),
        ("DUCTOR_SHUTDOWN_TIMEOUT_S", "0.1"),
        ("DUCTOR_LOG_FORMAT", "xml"),
        ("DUCTOR_LOG_LEVEL", "TRACE"),
        ("DUCTOR_METRICS_PORT", "65536"),
        ("DUCTOR_HEALTH_PORT", "-1"),
        ("DUCTOR_HTTP_HOST", ""),
        ("DUCTOR_HTTP_HOST", "0.0.0.0:8080"),
        ("DUCTOR_HTTP_HOST", "[::1]"),
        ("DUCTOR_HTTP_HOST", "my host"),
        ("DUCTOR_HTTP_HOST", "-bad.example"),
        ("DUCTOR_HTTP_HOST", "a" * 64),
        ("DUCTOR_KAFKA_", "x"),
    ],
)
def test_each_invalid_value_names_its_variable(var: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({var: raw})
    assert var in str(info.value)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("0.0.0.0", "0.0.0.0"),
        ("::", "::"),
        ("0:0::1", "::1"),
        ("localhost", "localhost"),
        ("ductor-1.pods.internal", "ductor-1.pods.internal"),
    ],
)
def test_the_http_host_is_an_address_or_a_host_name(raw: str, expected: str) -> None:
    assert Settings().http_host == "127.0.0.1"  # this machine only, unless told otherwise
    assert load_settings({"DUCTOR_HTTP_HOST": raw}).http_host == expected


def test_an_invalid_dsn_is_redacted_in_the_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"DUCTOR_PG_DSN": "mysql://u:topsecret@h/db"})
    assert "topsecret" not in str(info.value)


@FAST
@given(st.integers(-10, 20_000))
def test_integer_bounds(value: int) -> None:
    env = {"DUCTOR_STEP_PARTITIONS": str(value)}
    if 1 <= value <= 10_000:
        assert load_settings(env).step_partitions == value
    else:
        with pytest.raises(ConfigError, match="DUCTOR_STEP_PARTITIONS"):
            load_settings(env)


def test_kafka_passthrough() -> None:
    env = {
        "DUCTOR_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "DUCTOR_KAFKA_SASL_MECHANISM": "PLAIN",
        "DUCTOR_KAFKA_SASL_PASSWORD": "hunter2",
        "DUCTOR_KAFKA_SSL_KEY_PASSWORD": "k",
        "DUCTOR_BOOTSTRAP_SERVERS": "b:9093",
    }
    s = load_settings(env)
    assert s.kafka_extra == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.password": "hunter2",
        "ssl.key.password": "k",
    }
    assert s.kafka_common() == {"bootstrap.servers": "b:9093", **s.kafka_extra}
    redacted = s.kafka_redacted()
    assert redacted["sasl.password"] == "***"
    assert redacted["ssl.key.password"] == "***"
    assert redacted["security.protocol"] == "SASL_SSL"
    assert "hunter2" not in repr(redacted)


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        (
            "postgresql://ductor:secret@127.0.0.1:55432/ductor",
            "user=ductor password=*** dbname=ductor host=127.0.0.1 port=55432",
        ),
        (
            "postgres://u:p%40ss@db/x?sslmode=require",
            "user=u password=*** dbname=x host=db sslmode=require",
        ),
        ("postgresql://u:secret@db/x", "user=u password=*** dbname=x host=db"),
        ("postgresql://u@db:5432/x", "user=u dbname=x host=db port=5432"),
        ("postgresql://db/x", "dbname=x host=db"),
        (
            "postgresql://u:p@h1:5432,h2:5433/x",
            "user=u password=*** dbname=x host=h1,h2 port=5432,5433",
        ),
        ("host=db user=u password=secret dbname=x", "user=u password=*** dbname=x host=db"),
        ("host=db password = secret", "password=*** host=db"),
        ("host=db dbname=x", "dbname=x host=db"),
        ("host=db sslpassword=secret sslkey=k", "host=db sslkey=k sslpassword=***"),
        ("", ""),
    ],
)
def test_redact_dsn(dsn: str, expected: str) -> None:
    assert redact_dsn(dsn) == expected


@FAST
@given(
    user=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=10),
    password=st.text(
        alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~%!$&'()*+,;=",
        min_size=6,
        max_size=20,
    ),
    host=st.sampled_from(["db", "127.0.0.1", "pg.example.com"]),
    port=st.one_of(st.none(), st.integers(1, 65535)),
)
def test_redact_dsn_hides_url_passwords(
    user: str, password: str, host: str, port: int | None
) -> None:
    netloc = f"{user}:{password}@{host}" + (f":{port}" if port else "")
    redacted = redact_dsn(f"postgresql://{netloc}/db")
    expected = f"user={user} password=*** dbname=db host={host}" + (f" port={port}" if port else "")
    if "%" in password:
        # A percent-encoding libpq refuses (bad hex, a NUL, not UTF-8) makes the whole URI
        # unparseable: then all of it is hidden.
        assert redacted in (expected, "postgresql://***")
    else:
        assert redacted == expected


@FAST
@given(
    st.text(
        alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&*+-.",
        min_size=6,
        max_size=20,
    )
)
def test_redact_dsn_hides_keyword_passwords(password: str) -> None:
    redacted = redact_dsn(f"host=db user=u password={password} dbname=x")
    assert redacted == "user=u password=*** dbname=x host=db"


# Fixed (config.py redact_dsn): libpq also takes the password as a URI query parameter
# (postgresql://u@db/x?password=secret); redact_dsn only looks at the userinfo part of a URI,
# so it returns the DSN unchanged and the password reaches logs and error messages.
def test_redact_dsn_hides_a_password_given_as_a_uri_parameter() -> None:
    redacted = redact_dsn("postgresql://u@db:5432/x?sslmode=require&password=topsecret")
    assert "topsecret" not in redacted


# Fixed (config.py redact_dsn): in libpq's keyword/value form a value with spaces is
# single-quoted (password='correct horse'); the regex replaces only up to the first space, so
# redact_dsn("host=db password='correct horse battery'") gives
# "host=db password=*** horse battery'": most of the password stays in the logs.
def test_redact_dsn_hides_a_quoted_keyword_password() -> None:
    redacted = redact_dsn("host=db password='correct horse battery' dbname=x")
    assert "horse" not in redacted
    assert "battery" not in redacted
    assert "dbname=x" in redacted


# Fixed (config.py redact_dsn, cosmetic): rebuilding the netloc from parts.hostname drops
# the brackets of an IPv6 literal: "postgresql://u:secret@[::1]:5432/db" becomes
# "postgresql://u:***@::1:5432/db", which no longer says which host and port were used.
def test_redact_dsn_keeps_an_ipv6_host_readable() -> None:
    assert redact_dsn("postgresql://u:secret@[::1]:5432/db") == (
        "user=u password=*** dbname=db host=::1 port=5432"
    )


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://u:a secret@h/x", "postgresql://***"),  # spaces must be %20 in a URI
        ("postgresql://u:secret%zz@h/x", "postgresql://***"),
        ("mysql://u:secret@h/db", "mysql://***"),
        ("host='db password=secret", "***"),  # unterminated quote
        ("password=secret dbname", "***"),
        ("password=secret passwrd=x", "***"),  # an unknown keyword
        ("password=secret host=a://b garbage", "***"),
    ],
)
def test_an_unparseable_dsn_is_hidden_whole(dsn: str, expected: str) -> None:
    assert redact_dsn(dsn) == expected


# -- settings_env: the environment that reproduces a Settings --------------------------------

_VARIABLES = [f"DUCTOR_{f.name.upper()}" for f in fields(Settings) if f.name != "kafka_extra"]


def test_settings_env_covers_every_setting() -> None:
    env = settings_env(Settings())
    assert sorted(env) == sorted(_VARIABLES)
    assert load_settings(env) == Settings()


def test_settings_env_round_trips_every_field_changed() -> None:
    env = {
        "DUCTOR_BOOTSTRAP_SERVERS": "k1:9092,k2:9093",
        "DUCTOR_GROUP_ID": "g",
        "DUCTOR_GROUP_PROTOCOL": "classic",
        "DUCTOR_PG_DSN": "host=db user=u password='a b' dbname=x",
        "DUCTOR_WORKER_PG_DSN": "postgresql://w:pw@db/x",
        "DUCTOR_TOPIC_PREFIX": "p.q",
        "DUCTOR_WAKEUP_PARTITIONS": "7",
        "DUCTOR_DELAY_PARTITIONS": "7",
        "DUCTOR_STEP_PARTITIONS": "9",
        "DUCTOR_DLQ_PARTITIONS": "2",
        "DUCTOR_REPLICATION_FACTOR": "3",
        "DUCTOR_MIN_INSYNC_REPLICAS": "2",
        "DUCTOR_BATCH_SIZE": "17",
        "DUCTOR_BATCH_LINGER_MS": "5",
        "DUCTOR_TIER_WEIGHTS": "5:3:2",
        "DUCTOR_TIER_BUFFER_LIMIT": "11",
        "DUCTOR_LIVELOCK_REQUEUES": "3",
        "DUCTOR_STUCK_AFTER_S": "1.25",
        "DUCTOR_SWEEP_INTERVAL_S": "0.1",
        "DUCTOR_SWEEP_GRACE_S": "1e-7",
        "DUCTOR_SWEEP_LIMIT": "12",
        "DUCTOR_RELAY_AFTER_S": "4.5",
        "DUCTOR_KEPT_SIGNAL_TTL_S": "90",
        "DUCTOR_REQUESTS_WORKFLOWS": "orders,billing",
        "DUCTOR_REQUESTS_RUN_ID_PREFIXES": "",
        "DUCTOR_REQUESTS_SIGNALS": "cancel",
        "DUCTOR_TRIGGER_REFRESH_S": "2.5",
        "DUCTOR_INSTANCE_TIMEOUT_S": "7.5",
        "DUCTOR_PARTITION_BY_RUN": "off",
        "DUCTOR_MAX_RECORD_BYTES": "300",
        "DUCTOR_SHUTDOWN_TIMEOUT_S": "inf",
        "DUCTOR_LOG_FORMAT": "text",
        "DUCTOR_LOG_LEVEL": "ERROR",
        "DUCTOR_METRICS_PORT": "9464",
        "DUCTOR_STATS_LOG_INTERVAL_S": "0.75",
        "DUCTOR_HEALTH_PORT": "8081",
        "DUCTOR_HEALTH_STALL_S": "3",
        "DUCTOR_GROUP_STALL_S": "0",
        "DUCTOR_WORKER_NAME": "worker-7",
        "DUCTOR_WORKER_SESSION_TIMEOUT_MS": "0",
        "DUCTOR_HTTP_HOST": "0.0.0.0",
        "DUCTOR_TEST_FAULTS": "after_commit=kill@2",
        "DUCTOR_TEST_CLOCK_AHEAD_MS": "-1500",
        "DUCTOR_UI_TOKEN": "a-token-of-24-characters",
        "DUCTOR_UI_ALLOWED_HOSTS": "ductor.example.com,[::1],*.internal",
        "DUCTOR_UI_READ_TOKEN_REQUIRED": "yes",
        "DUCTOR_UI_WINDOW_S": "3600",
        "DUCTOR_UI_MAX_WINDOW_S": "172800.5",
        "DUCTOR_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "DUCTOR_KAFKA_SASL_PASSWORD": "hunter2",
    }
    s = load_settings(env)
    changed = [
        f.name for f in fields(Settings) if getattr(s, f.name) == getattr(Settings(), f.name)
    ]
    assert changed == [], f"the example leaves {changed} at their defaults"
    assert load_settings(settings_env(s)) == s
    assert settings_env(s)["DUCTOR_TIER_WEIGHTS"] == "5:3:2:3"
    assert settings_env(s)["DUCTOR_KAFKA_SASL_PASSWORD"] == "hunter2"


_RAW = st.one_of(
    st.integers(-1, 40).map(str),
    st.integers(-1, 70_000).map(str),
    st.floats(allow_nan=True).map(str),
    st.sampled_from(["true", "Off", "", "x y"]),
    st.sampled_from(["consumer", "classic", "json", "text", "DEBUG", "WARNING"]),
    st.lists(st.integers(1, 1000).map(str), min_size=2, max_size=5).map(":".join),
    st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True),
    st.builds("{}:{}".format, st.sampled_from(["k", "10.0.0.1", "b.example"]), st.integers(1, 9)),
    st.builds("postgresql://u:{}@db/x".format, st.text("abc%40-_", min_size=1, max_size=8)),
)


@FAST
@given(
    candidates=st.fixed_dictionaries({}, optional=dict.fromkeys(_VARIABLES, _RAW)),
    kafka=st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9]{0,6}(_[A-Z0-9]{1,6}){0,3}", fullmatch=True).map(
            "DUCTOR_KAFKA_{}".format
        ),
        st.text(max_size=10),
        max_size=3,
    ),
)
def test_settings_env_round_trips(candidates: dict[str, str], kafka: dict[str, str]) -> None:
    env = {
        k: v
        for k, v in kafka.items()
        if all(refusal(property_of(k), protocol) is None for protocol in ("consumer", "classic"))
    }
    for var, raw in candidates.items():  # keep the values load_settings accepts
        try:
            load_settings({**env, var: raw})
        except ConfigError:
            continue
        env[var] = raw
    s = load_settings(env)
    assert load_settings(settings_env(s)) == s


def test_settings_env_refuses_a_property_no_variable_can_give() -> None:
    with pytest.raises(ConfigError, match="ssl_key"):
        settings_env(Settings(kafka_extra={"ssl_key": "x"}))


def test_the_web_page_s_token_is_long_enough_to_guess_never_or_not_set() -> None:
    assert load_settings({}).ui_token == ""
    assert load_settings({"DUCTOR_UI_TOKEN": ""}).ui_token == ""
    assert load_settings({"DUCTOR_UI_TOKEN": "x" * 16}).ui_token == "x" * 16
    for short in ("secret", "x" * 15, "é" * 20, "tab\there-and-long-enough"):
        with pytest.raises(ConfigError, match="at least 16 printable ASCII characters"):
            load_settings({"DUCTOR_UI_TOKEN": short})
    assert "x" * 16 not in repr(load_settings({"DUCTOR_UI_TOKEN": "x" * 16}))
