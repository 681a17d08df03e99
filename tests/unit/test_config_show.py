"""`ductor config show`: every setting in effect, secrets hidden, where each came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.cli.config import show_lines
from processor.cli.main import main, parse_args
from processor.io.config.settings import load_settings
from processor.io.config.variables import SETTING_VARIABLES


def test_every_setting_is_shown_with_its_source_and_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    dsn = tmp_path / "dsn"
    dsn.write_text("postgresql://app:pg-s3cret@db:5432/runs\n")
    env = {
        "DUCTOR_PG_DSN_FILE": str(dsn),
        "DUCTOR_KAFKA_SASL_PASSWORD": "kafka-s3cret",
        "DUCTOR_KAFKA_COMPRESSION_TYPE": "zstd",
        "DUCTOR_LOG_LEVEL": "debug",
    }
    lines = show_lines(load_settings(env), env)
    text = "\n".join(lines)
    assert "s3cret" not in text
    for var in SETTING_VARIABLES:
        assert any(line.startswith(f"{var}=") for line in lines), var
    assert (
        f"DUCTOR_PG_DSN=user=app password=*** dbname=runs host=db port=5432  # file {dsn}" in lines
    )
    assert "DUCTOR_LOG_LEVEL=DEBUG  # env" in lines
    assert "DUCTOR_BATCH_SIZE=500  # default" in lines
    assert "DUCTOR_KAFKA_SASL_PASSWORD=***  # env" in lines
    assert "kafka.producer compression.type=zstd  # env DUCTOR_KAFKA_COMPRESSION_TYPE" in lines
    assert "kafka.producer linger.ms=2  # default" in lines
    assert "kafka.producer enable.idempotence=true  # fixed" in lines
    assert "kafka.consumer group.id=ductor-coordinator  # DUCTOR_GROUP_ID" in lines
    assert "kafka.consumer sasl.password=***  # env DUCTOR_KAFKA_SASL_PASSWORD" in lines
    assert "traces: not exported" in lines


def test_config_show_is_a_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_args(["config", "check"]).func.__name__ == "cmd_config_check"
    monkeypatch.setenv("DUCTOR_PG_DSN", "postgresql://u:hidden-pw@h/x")
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "hidden-pw" not in out
    assert "DUCTOR_PG_DSN=user=u password=*** dbname=x host=h  # env" in out.splitlines()
