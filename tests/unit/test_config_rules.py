"""Configuration that says what it does (processor/io/config/settings.py,
io/config/kafka_properties.py, io/kafka/clients.py): a Kafka property given overrides the project's
default or is refused with the reason, an unknown DUCTOR_* name is refused with the nearest known
one, enum values in any case, related settings checked together, secrets from files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from processor.io.config.kafka_properties import OWNED, variable_for
from processor.io.config.settings import Settings, child_env, load_settings, setting_sources
from processor.io.config.values import ConfigError
from processor.io.config.variables import (
    KNOWN_PREFIXES,
    READ_ELSEWHERE,
    SECRET_VARIABLES,
    SETTING_VARIABLES,
    is_known_variable,
)
from processor.io.kafka.configs import (
    consumer_config,
    producer_config,
    reader_config,
    worker_consumer_config,
)

REPO = Path(__file__).resolve().parents[2]

# -- DUCTOR_KAFKA_*: the project's defaults give way, what it owns is refused ------------------


@pytest.mark.parametrize(
    ("env", "build", "prop", "value"),
    [
        (
            {"DUCTOR_KAFKA_MAX_POLL_INTERVAL_MS": "900000"},
            consumer_config,
            "max.poll.interval.ms",
            "900000",
        ),
        ({"DUCTOR_KAFKA_COMPRESSION_TYPE": "zstd"}, producer_config, "compression.type", "zstd"),
        ({"DUCTOR_KAFKA_LINGER_MS": "20"}, producer_config, "linger.ms", "20"),
        (
            {"DUCTOR_KAFKA_MESSAGE_TIMEOUT_MS": "5000"},
            producer_config,
            "message.timeout.ms",
            "5000",
        ),
        (
            {"DUCTOR_KAFKA_FETCH_MAX_BYTES": "1048576"},
            consumer_config,
            "fetch.max.bytes",
            "1048576",
        ),
        (
            {"DUCTOR_GROUP_PROTOCOL": "classic", "DUCTOR_KAFKA_SESSION_TIMEOUT_MS": "45000"},
            consumer_config,
            "session.timeout.ms",
            "45000",
        ),
        (
            {"DUCTOR_GROUP_PROTOCOL": "classic", "DUCTOR_KAFKA_SESSION_TIMEOUT_MS": "45000"},
            worker_consumer_config,
            "session.timeout.ms",
            "45000",
        ),
        (
            {"DUCTOR_KAFKA_GROUP_REMOTE_ASSIGNOR": "uniform"},
            consumer_config,
            "group.remote.assignor",
            "uniform",
        ),
        ({"DUCTOR_KAFKA_CLIENT_ID": "quota-a"}, producer_config, "client.id", "quota-a"),
    ],
)
def test_a_kafka_property_given_replaces_the_projects_default(
    env: dict[str, str], build: Any, prop: str, value: str
) -> None:
    assert build(load_settings(env), "c")[prop] == value
    # ... where the project has a default of its own
    without = {k: v for k, v in env.items() if not k.startswith("DUCTOR_KAFKA_")}
    assert build(load_settings(without), "c")[prop] != value


def _client_configs(settings: Settings) -> dict[str, dict[str, Any]]:
    return {
        "producer": producer_config(settings, "p"),
        "consumer": consumer_config(settings, "c"),
        "worker": worker_consumer_config(settings, "w"),
        "reader": reader_config(settings, "r", "g"),
    }


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_every_default_of_every_client_can_be_replaced_and_nothing_owned_can(
    protocol: str,
) -> None:
    plain = _client_configs(Settings(group_protocol=protocol))
    for name, config in plain.items():
        defaults = {k for k in config if k not in OWNED}
        replaced = Settings(group_protocol=protocol, kafka_extra=dict.fromkeys(defaults, "X"))
        given = _client_configs(replaced)[name]
        assert {k for k in defaults if given[k] != "X"} == set(), name
        # What the client sets itself and the correctness depends on is listed as owned, so a
        # variable giving it is refused at start instead of being overwritten without a word.
        assert {k: given[k] for k in config if k in OWNED} == {
            k: v for k, v in config.items() if k in OWNED
        }


@pytest.mark.parametrize(
    ("var", "says"),
    [
        ("DUCTOR_KAFKA_ENABLE_AUTO_COMMIT", "auto-commit"),
        ("DUCTOR_KAFKA_ENABLE_AUTO_OFFSET_STORE", "lose records"),
        ("DUCTOR_KAFKA_ENABLE_IDEMPOTENCE", "no duplicate"),
        ("DUCTOR_KAFKA_ACKS", "acks=all"),
        ("DUCTOR_KAFKA_TRANSACTIONAL_ID", "not transactional"),
        ("DUCTOR_KAFKA_GROUP_ID", "DUCTOR_GROUP_ID"),
        ("DUCTOR_KAFKA_GROUP_PROTOCOL", "DUCTOR_GROUP_PROTOCOL"),
        ("DUCTOR_KAFKA_BOOTSTRAP_SERVERS", "DUCTOR_BOOTSTRAP_SERVERS"),
        ("DUCTOR_KAFKA_PARTITION_ASSIGNMENT_STRATEGY", "incrementally"),
        ("DUCTOR_KAFKA_AUTO_OFFSET_RESET", "earliest"),
        ("DUCTOR_KAFKA_MESSAGE_MAX_BYTES", "DUCTOR_MAX_RECORD_BYTES"),
    ],
)
def test_a_property_the_project_owns_is_refused_with_the_reason(var: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({var: "x"})
    message = str(info.value)
    assert message.startswith(f"{var}: ")
    assert says in message
    assert "\n" not in message


def test_the_broker_side_timeouts_of_the_consumer_protocol_are_refused_with_the_way_out() -> None:
    for var in ("DUCTOR_KAFKA_SESSION_TIMEOUT_MS", "DUCTOR_KAFKA_HEARTBEAT_INTERVAL_MS"):
        with pytest.raises(ConfigError, match="DUCTOR_GROUP_PROTOCOL=classic") as info:
            load_settings({var: "45000"})
        assert str(info.value).startswith(var)
        assert load_settings({var: "45000", "DUCTOR_GROUP_PROTOCOL": "classic"})
    with pytest.raises(ConfigError, match="only under the consumer group protocol"):
        load_settings(
            {"DUCTOR_KAFKA_GROUP_REMOTE_ASSIGNOR": "range", "DUCTOR_GROUP_PROTOCOL": "classic"}
        )


def test_a_settings_object_built_in_code_is_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"enable\.auto\.commit"):
        Settings(kafka_extra={"enable.auto.commit": "false"})


def test_every_owned_property_is_refused_as_a_variable() -> None:
    for prop in OWNED:
        with pytest.raises(ConfigError, match=variable_for(prop)):
            load_settings({variable_for(prop): "x"})


# -- unknown DUCTOR_* names -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "nearest"),
    [
        ("DUCTOR_BATCHSIZE", "DUCTOR_BATCH_SIZE"),
        ("DUCTOR_PG_DNS", "DUCTOR_PG_DSN"),
        ("DUCTOR_LOG_LEVLE", "DUCTOR_LOG_LEVEL"),
        ("DUCTOR_METRIC_PORT", "DUCTOR_METRICS_PORT"),
        ("DUCTOR_PG_DSN_FIEL", "DUCTOR_PG_DSN_FILE"),
        ("DUCTOR_LOCAL_PG_PROT", "DUCTOR_LOCAL_PG_PORT"),
    ],
)
def test_an_unknown_name_is_refused_with_the_nearest_known_one(name: str, nearest: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({name: "1"})
    assert f"{name} is not a setting of Ductor (did you mean {nearest}?)" in str(info.value)


def test_a_name_like_no_other_is_refused_without_a_guess() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"DUCTOR_ZZZ": "1"})
    assert str(info.value) == (
        "DUCTOR_ZZZ is not a setting of Ductor; `ductor config show` lists the settings"
    )


def test_the_names_other_programs_read_are_accepted() -> None:
    env = dict.fromkeys(READ_ELSEWHERE, "1")
    assert load_settings({**env, "DUCTOR_KAFKA_SOCKET_TIMEOUT_MS": "1000"}).kafka_extra == {
        "socket.timeout.ms": "1000"
    }


# Names that look like variables and are not: a Python constant of the tests' fixtures, and
# the misspelling the docs show being refused.
_NOT_VARIABLES = {"DUCTOR_SCRIPT", "DUCTOR_BATCHSIZE"}


def test_every_ductor_variable_the_repository_names_is_known() -> None:
    """One registry: a name read or set anywhere (code, infra, docs, the integration tests,
    the Makefile, CI) is a setting, a secret's file, a name another program reads or a Kafka
    property; a name missing from the registry would be refused at start."""
    paths = [REPO / "Makefile", REPO / "README.md", REPO / ".ci" / "run"]
    for folder in ("processor", "infra", "docs", "examples", "tests/integration"):
        paths += [p for p in (REPO / folder).rglob("*") if p.is_file() and p.suffix != ".pyc"]
    seen: dict[str, Path] = {}
    for path in paths:
        if not path.exists():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for name in re.findall(r"\bDUCTOR_[A-Z0-9_]*[A-Z0-9]\b", text):
            seen.setdefault(name, path)
    unknown = {
        n: str(p.relative_to(REPO))
        for n, p in seen.items()
        if n not in _NOT_VARIABLES and not is_known_variable(n)
    }
    assert unknown == {}
    assert set(SETTING_VARIABLES) <= set(seen)  # every setting is named somewhere (documented)
    assert KNOWN_PREFIXES == ("DUCTOR_KAFKA_",)


# -- enum values in any case --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "raw", "attribute", "value"),
    [
        ("DUCTOR_LOG_LEVEL", "info", "log_level", "INFO"),
        ("DUCTOR_LOG_LEVEL", "Warning", "log_level", "WARNING"),
        ("DUCTOR_LOG_FORMAT", "TEXT", "log_format", "text"),
        ("DUCTOR_GROUP_PROTOCOL", " Classic ", "group_protocol", "classic"),
    ],
)
def test_enum_values_are_read_in_any_case(var: str, raw: str, attribute: str, value: str) -> None:
    assert getattr(load_settings({var: raw}), attribute) == value


# -- related settings ---------------------------------------------------------------------------


def test_wakeup_and_delay_partitions_must_be_equal() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"DUCTOR_WAKEUP_PARTITIONS": "12"})
    assert "DUCTOR_DELAY_PARTITIONS=6 differs from DUCTOR_WAKEUP_PARTITIONS=12" in str(info.value)
    both = load_settings({"DUCTOR_WAKEUP_PARTITIONS": "12", "DUCTOR_DELAY_PARTITIONS": "12"})
    assert (both.wakeup_partitions, both.delay_partitions) == (12, 12)


def test_the_metrics_and_health_servers_need_a_port_each() -> None:
    with pytest.raises(ConfigError, match="DUCTOR_METRICS_PORT and DUCTOR_HEALTH_PORT are both"):
        load_settings({"DUCTOR_METRICS_PORT": "9464", "DUCTOR_HEALTH_PORT": "9464"})
    assert load_settings({"DUCTOR_METRICS_PORT": "9464", "DUCTOR_HEALTH_PORT": "8081"})


# -- secrets from files -------------------------------------------------------------------------


def test_secrets_are_read_from_files_without_their_trailing_newline(tmp_path: Path) -> None:
    dsn = tmp_path / "dsn"
    dsn.write_text("postgresql://u:s3cret@db/x\n")
    password = tmp_path / "password"
    password.write_text("hunter2\r\n")
    env = {
        "DUCTOR_PG_DSN_FILE": str(dsn),
        "DUCTOR_KAFKA_SASL_PASSWORD_FILE": str(password),
        "DUCTOR_KAFKA_SASL_USERNAME": "ductor",
    }
    s = load_settings(env)
    assert s.pg_dsn == "postgresql://u:s3cret@db/x"
    assert s.kafka_extra == {"sasl.password": "hunter2", "sasl.username": "ductor"}
    sources = setting_sources(env)
    assert sources["DUCTOR_PG_DSN"] == f"file {dsn}"
    assert sources["DUCTOR_KAFKA_SASL_PASSWORD"] == f"file {password}"
    assert sources["DUCTOR_KAFKA_SASL_USERNAME"] == "env"
    assert sources["DUCTOR_BATCH_SIZE"] == "default"
    assert "DUCTOR_PG_DSN_FILE" not in sources
    # Only one newline goes: a value that ends in blank lines keeps the others.
    password.write_text("two\n\n")
    assert load_settings(env).kafka_extra["sasl.password"] == "two\n"


def test_a_secret_set_both_ways_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dsn").write_text("host=db")
    with pytest.raises(ConfigError, match="DUCTOR_PG_DSN and DUCTOR_PG_DSN_FILE are both set"):
        load_settings({"DUCTOR_PG_DSN": "host=x", "DUCTOR_PG_DSN_FILE": str(tmp_path / "dsn")})


def test_an_unreadable_secret_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    with pytest.raises(ConfigError) as info:
        load_settings({"DUCTOR_KAFKA_SASL_PASSWORD_FILE": str(missing)})
    assert str(info.value) == (
        f"DUCTOR_KAFKA_SASL_PASSWORD_FILE={str(missing)!r} cannot be read:"
        " No such file or directory"
    )


def test_an_empty_dsn_file_is_an_empty_dsn(tmp_path: Path) -> None:
    (tmp_path / "dsn").write_text("\n")
    with pytest.raises(ConfigError, match="DUCTOR_PG_DSN is empty"):
        load_settings({"DUCTOR_PG_DSN_FILE": str(tmp_path / "dsn")})


def test_a_child_gets_exactly_the_settings_given_whatever_its_parent_had(tmp_path: Path) -> None:
    (tmp_path / "dsn").write_text("host=parent")
    parent = {
        "PATH": "/bin",
        "DUCTOR_INFRA": "local",
        "DUCTOR_PG_DSN_FILE": str(tmp_path / "dsn"),
        "DUCTOR_KAFKA_SASL_PASSWORD": "parents",
    }
    settings = Settings(pg_dsn="host=child", kafka_extra={"linger.ms": "5"})
    env = child_env(settings, parent)
    assert load_settings(env) == settings
    assert env["PATH"] == "/bin"
    assert env["DUCTOR_INFRA"] == "local"
    assert "DUCTOR_PG_DSN_FILE" not in env
    assert "DUCTOR_KAFKA_SASL_PASSWORD" not in env


def test_the_operations_guide_lists_every_property_ductor_owns_and_every_secret() -> None:
    section = (REPO / "docs" / "operations" / "configuration.md").read_text()
    assert [p for p in OWNED if f"`{p}`" not in section] == []
    for var in SECRET_VARIABLES:
        assert var.removeprefix("DUCTOR_KAFKA") in section, var
