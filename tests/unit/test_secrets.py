"""No secret is ever printed: not by ``repr``/``str`` of the settings, not by `ductor config
show` (text or JSON), not by the lines a command logs at its start; and a secret file others
than its owner may read is warned about (processor/io/config/settings.py, processor/cli/config.py).

Each case gives one secret the way an operator would (a variable, or a file) and looks for its
text everywhere the settings are shown."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from processor.cli.config import show_lines
from processor.cli.main import main
from processor.io.config.kafka_properties import SECRET_PROPERTIES, is_secret, variable_for
from processor.io.config.settings import load_settings
from processor.io.config.variables import SECRET_VARIABLES, secret_file_warnings

SECRET = "S3cr3t-Wh1ch-Must-N0t-Show"

# variable -> value: each carries SECRET somewhere a careless printer would show it.
CASES: dict[str, dict[str, str]] = {
    "dsn as a URL": {"DUCTOR_PG_DSN": f"postgresql://app:{SECRET}@db:5432/runs"},
    "dsn as a URL parameter": {"DUCTOR_PG_DSN": f"postgresql://app@db/runs?password={SECRET}"},
    "dsn as keywords": {"DUCTOR_PG_DSN": f"host=db user=app password='{SECRET}' dbname=runs"},
    "dsn's key password": {"DUCTOR_PG_DSN": f"host=db sslkey=/k sslpassword={SECRET}"},
    "PGPASSWORD": {"PGPASSWORD": SECRET, "DUCTOR_PG_DSN": "host=db user=app dbname=runs"},
    "ui token": {"DUCTOR_UI_TOKEN": SECRET},
    "otlp headers": {
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{SECRET},x-tenant=ops",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"api-key={SECRET}",
    },
    # A PEM property librdkafka may add later is hidden by its name alone.
    "a certificate string": {"DUCTOR_KAFKA_SSL_CERTIFICATE_PEM": f"-----BEGIN\n{SECRET}\n-----"},
    **{
        prop: {variable_for(prop): f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END-----"}
        for prop in sorted(SECRET_PROPERTIES)
    },
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment without the settings of the shell that runs the tests."""
    for name in list(os.environ):
        if name.startswith(("DUCTOR_", "OTEL_", "PG")):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_secret_is_printed_by_the_settings_or_config_show(
    case: str, clean_env: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    env = CASES[case]
    for name, value in env.items():
        clean_env.setenv(name, value)
    settings = load_settings()
    assert SECRET not in repr(settings) and SECRET not in str(settings)
    assert SECRET not in repr(settings.redacted()) and SECRET not in repr(settings.kafka_redacted())
    assert SECRET not in "\n".join(show_lines(settings))
    capfd.readouterr()
    for output in ("text", "json"):
        assert main(["config", "show", "--output", output]) == 0
        shown = capfd.readouterr()
        assert SECRET not in shown.out and SECRET not in shown.err, output
    document = orjson.loads(_json_of_config_show(capfd))
    for var in env:
        if var in document["settings"]:
            assert document["settings"][var]["source"] == "env"


def _json_of_config_show(capfd: pytest.CaptureFixture[str]) -> str:
    assert main(["config", "show", "--output", "json"]) == 0
    return capfd.readouterr().out


def test_what_is_hidden_is_said_where_it_is_shown(clean_env: pytest.MonkeyPatch) -> None:
    """Hidden, not dropped: the operator still sees that each secret is set, and from where."""
    env = {
        "DUCTOR_PG_DSN": f"postgresql://app:{SECRET}@db:5432/runs",
        "DUCTOR_KAFKA_SASL_USERNAME": "ductor-app",
        "DUCTOR_KAFKA_SASL_OAUTHBEARER_CONFIG": f"principal=app secret={SECRET}",
        "DUCTOR_KAFKA_SSL_KEY_LOCATION": "/run/secrets/kafka.key",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{SECRET},x-tenant=ops",
    }
    lines = show_lines(load_settings(env), env)
    for line in (
        "DUCTOR_PG_DSN=user=app password=*** dbname=runs host=db port=5432  # env",
        "DUCTOR_KAFKA_SASL_OAUTHBEARER_CONFIG=***  # env",
        "DUCTOR_KAFKA_SASL_USERNAME=ductor-app  # env",  # an account's name is not its secret
        "DUCTOR_KAFKA_SSL_KEY_LOCATION=/run/secrets/kafka.key  # env",  # nor a file's path
        "kafka.consumer sasl.oauthbearer.config=***  # env DUCTOR_KAFKA_SASL_OAUTHBEARER_CONFIG",
        "OTEL_EXPORTER_OTLP_HEADERS=authorization=***,x-tenant=***  # env",
    ):
        assert line in lines, line
    settings = load_settings(env)
    assert "pg_dsn='user=app password=*** dbname=runs host=db port=5432'" in repr(settings)
    assert "'sasl.oauthbearer.config': '***'" in repr(settings)


def test_every_secret_librdkafka_flags_is_hidden_and_a_file_s_path_is_not() -> None:
    # rdkafka_conf.c's _RK_SENSITIVE properties that carry the secret itself, and the alias.
    for prop in (
        "sasl.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.keystore.password",
        "ssl.ca.pem",
        "SSL.Key.Password",
        "some.future.password",
    ):
        assert is_secret(prop), prop
    for prop in (
        "sasl.username",
        "ssl.key.location",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.client.id",
        "security.protocol",
    ):
        assert not is_secret(prop), prop
    # Each secret property may come from a file, as the DSN and the token may.
    for prop in SECRET_PROPERTIES:
        assert variable_for(prop) in SECRET_VARIABLES


def _secret_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / f"dsn-{mode:o}"
    path.write_text(f"postgresql://app:{SECRET}@db:5432/runs\n")
    path.chmod(mode)
    return path


def test_a_secret_file_others_may_read_is_warned_about(tmp_path: Path) -> None:
    shared, private = _secret_file(tmp_path, 0o644), _secret_file(tmp_path, 0o600)
    (warning,) = secret_file_warnings({"DUCTOR_PG_DSN_FILE": str(shared)})
    assert warning == (
        f"DUCTOR_PG_DSN_FILE={str(shared)!r} is readable by its group and others (mode 0644):"
        " make it readable by its owner only (chmod 600, or a secret volume's defaultMode)"
    )
    assert SECRET not in warning
    assert secret_file_warnings({"DUCTOR_PG_DSN_FILE": str(private)}) == []
    group = _secret_file(tmp_path, 0o640)
    (warning,) = secret_file_warnings({"DUCTOR_UI_TOKEN_FILE": str(group)})
    assert "readable by its group (mode 0640)" in warning
    assert secret_file_warnings({"DUCTOR_PG_DSN_FILE": str(tmp_path / "absent")}) == []


def test_a_command_logs_the_warning_at_its_start_and_never_the_secret(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    for mode, warned in ((0o644, True), (0o600, False)):
        clean_env.setenv("DUCTOR_PG_DSN_FILE", str(_secret_file(tmp_path, mode)))
        clean_env.setenv("DUCTOR_LOG_FORMAT", "json")
        assert main(["config", "show"]) == 0
        printed = capfd.readouterr()
        assert SECRET not in printed.out and SECRET not in printed.err
        logged = [orjson.loads(line) for line in printed.err.splitlines() if line.startswith("{")]
        warnings = [line for line in logged if "DUCTOR_PG_DSN_FILE" in line["msg"]]
        assert len(warnings) == (1 if warned else 0), printed.err
        if warned:
            assert warnings[0]["level"] == "WARNING" and "mode 0644" in warnings[0]["msg"]
