"""No traceback from any command (processor/cli/errors.py): every failure is one sentence on
stderr and an exit code; bad configuration and a port in use are exit 2."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.cli.common import CliError
from processor.cli.errors import explain
from processor.cli.main import main
from processor.client import InvalidArgument
from processor.engine.health import Probe
from processor.io.config.values import ConfigError
from processor.io.kafka.errors import MissingTopic
from processor.io.runtime.health_http import HealthServer
from processor.io.runtime.listen import ListenError
from processor.io.telemetry.setup import Telemetry

# Nothing answers on port 1: the services' clients are made, none of them reaches anything.
_NOWHERE = {
    "DUCTOR_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    "DUCTOR_PG_DSN": "postgresql://u:p@127.0.0.1:1/x?connect_timeout=1",
}


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_health_port_in_use_is_one_sentence_naming_the_setting(taken_port: int) -> None:
    with pytest.raises(ListenError) as info:
        HealthServer(Probe("p"), "host=nowhere", port=taken_port, host="127.0.0.1")
    assert str(info.value) == (
        f"the health endpoint cannot listen on 127.0.0.1:{taken_port}; something else listens"
        " there: stop it or set DUCTOR_HEALTH_PORT to a free port"
    )


def test_a_metrics_port_in_use_is_one_sentence_naming_the_setting(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with pytest.raises(
        ListenError, match=f"metrics endpoint cannot listen on 127.0.0.1:{taken_port}"
    ):
        Telemetry.from_environment("ductor-test", taken_port, "g")


@pytest.mark.parametrize("setting", ["DUCTOR_METRICS_PORT", "DUCTOR_HEALTH_PORT"])
@pytest.mark.parametrize("command", ["process", "worker"])
def test_a_service_whose_port_is_in_use_exits_2_with_one_sentence(
    taken_port: int, setting: str, command: str
) -> None:
    env = {"PATH": "/usr/bin:/bin", **_NOWHERE, setting: str(taken_port)}
    done = subprocess.run(
        [sys.executable, "-m", "processor", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    what = "metrics" if setting == "DUCTOR_METRICS_PORT" else "health"
    # The sentence is all there is: librdkafka's lines about the unreachable broker go
    # through the logger (io/kafka/logs.py), and none is served before the command stops.
    assert done.stderr.splitlines() == [
        f"ductor: the {what} endpoint cannot listen on 127.0.0.1:{taken_port}; something else"
        f" listens there: stop it or set {setting} to a free port"
    ]


def test_bad_configuration_exits_2_saying_what_to_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DUCTOR_BATCHSIZE", "100")
    assert main(["inspect", "some-run"]) == 2
    assert capsys.readouterr().err == (
        "ductor: configuration error: DUCTOR_BATCHSIZE is not a setting of Ductor (did you mean"
        " DUCTOR_BATCH_SIZE?); `ductor config show` lists the settings\n"
    )


@pytest.mark.parametrize(
    ("exc", "code", "message"),
    [
        (ConfigError("DUCTOR_X=1 is wrong"), 2, "configuration error: DUCTOR_X=1 is wrong"),
        (CliError("no run with id 'r'", 1), 1, "no run with id 'r'"),
        (
            KafkaException(KafkaError(KafkaError._INVALID_ARG, 'No such property: "x.y"')),
            2,
            'configuration error: No such property: "x.y"; check the DUCTOR_KAFKA_* variables',
        ),
        (
            KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down")),
            1,
            "Kafka error: broker down; is the broker up (make up)?",
        ),
        (
            FileNotFoundError(2, "No such file or directory"),
            1,
            "[Errno 2] No such file or directory",
        ),
        (RuntimeError("first line\nsecond line"), 1, "first line"),
        (
            MissingTopic("topic t does not exist; run `ductor topics create` first"),
            2,
            "topic t does not exist; run `ductor topics create` first",
        ),
        (
            InvalidArgument("a run id is 1 to 200 characters, not 300"),
            2,
            "a run id is 1 to 200 characters, not 300",
        ),
        (
            ZeroDivisionError("division by zero"),
            1,
            "unexpected error (ZeroDivisionError: division by zero); this is a bug of Ductor,"
            " DUCTOR_LOG_LEVEL=DEBUG logs its traceback",
        ),
    ],
)
def test_the_one_classifier_gives_every_failure_a_sentence_and_a_code(
    exc: Exception, code: int, message: str
) -> None:
    failure = explain(exc)
    assert (failure.code, failure.message) == (code, message)
    assert "\n" not in failure.message


def test_an_unexpected_error_in_a_command_is_no_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_args: object) -> int:
        raise KeyError("oops")

    monkeypatch.setattr("processor.cli.runs.read_run", broken)
    monkeypatch.setattr("processor.cli.runs.connect", _FakeConnection)
    assert main(["inspect", "r"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


class _FakeConnection:
    def __init__(self, *_args: object) -> None:
        pass

    def __enter__(self) -> _FakeConnection:
        return self

    def __exit__(self, *_args: object) -> None:
        return None


_DEEP = "[" * 400 + "1" + "]" * 400  # read by orjson (1,024 levels), never written (254)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["start", "sample", "--input", _DEEP], "the input at $[0][0][0][0][0][0][0][0]…"),
        (["start", "sample", "--input", _DEEP, "--via", "kafka"], "is nested deeper than 64"),
        (["start", "sample", "--input", '{"a": "\\u0000"}'], "the input at $.a holds a NUL"),
        (["start", "sample", "--input", '{"n": 99999999999999999999}'], "at $.n is the integer"),
        (["start", "sample", "--run-id", "o-1/ship#1"], "the id of a child run (PARENT/STEP#N)"),
        (
            ["start", "sample", "--run-id", "nightly@2026-12-04T02:00:00Z", "--via", "kafka"],
            "the id of a schedule's run (NAME@TIME)",
        ),
        (["signal", "r-1", "approved", "--payload", _DEEP], "the payload at $[0][0]"),
        (["signal", "r-1", "ok", "--payload", _DEEP, "--via", "kafka"], "the payload at $[0]"),
    ],
)
def test_a_start_or_signal_beyond_the_bounds_exits_2_naming_the_path_before_any_connection(
    args: list[str], says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in _NOWHERE.items():  # nothing to reach: refused before any connection
        monkeypatch.setenv(name, value)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("ductor: ") and says in err and err.count("\n") == 1, err
