"""What a command's failure means for its caller: the one place that turns an exception into
the sentence printed on stderr and the exit code, so no command decides it again and no
command ends in a traceback.

2: the configuration or the usage is wrong (fix it and run again; nothing was done: a topic
that does not exist is one, a start whose input its workflow's schema refuses another, a value
beyond the bounds of stored JSON or a run id only Ductor may give a third, a signal to a run
that has ended or of a name no wait step waits for a fourth, a workflow that is not
registered a fifth); 1: the operation failed (a service unreachable, a refusal, a run that is
not found); the command's own ``CliError`` codes (grammar.EXIT_TABLE).
An error nobody expected is a bug: one sentence too, its traceback logged at DEBUG.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from confluent_kafka import KafkaError, KafkaException

from processor.cli.common import EXIT_FAILED, EXIT_USAGE, CliError
from processor.client import (
    InvalidArgument,
    InvalidInput,
    OutOfBounds,
    ReservedRunId,
    SignalRefused,
)
from processor.core.model import UnknownWorkflow
from processor.io.config.values import ConfigError
from processor.io.kafka.errors import MissingTopic
from processor.io.runtime.listen import ListenError
from processor.io.telemetry.logs import first_line

log = logging.getLogger("ductor.cli")


@dataclass(frozen=True)
class CommandFailure:
    message: str  # one line, without the "ductor: " prefix
    code: int


def explain(exc: Exception) -> CommandFailure:
    if isinstance(exc, ConfigError):
        return CommandFailure(f"configuration error: {exc}", EXIT_USAGE)
    refused = InvalidArgument | InvalidInput | OutOfBounds | ReservedRunId | SignalRefused
    # An unknown workflow is refused input wherever it is named (start, schedules, triggers,
    # workflows show): nothing was done.
    if isinstance(exc, ListenError | MissingTopic | UnknownWorkflow | refused):
        return CommandFailure(str(exc), EXIT_USAGE)
    if isinstance(exc, CliError):
        return CommandFailure(str(exc), exc.code)
    if isinstance(exc, KafkaException):
        error = exc.args[0] if exc.args else exc
        if isinstance(error, KafkaError) and error.code() == KafkaError._INVALID_ARG:
            return CommandFailure(
                f"configuration error: {error.str()}; check the DUCTOR_KAFKA_* variables",
                EXIT_USAGE,
            )
        text = error.str() if isinstance(error, KafkaError) else first_line(exc)
        return CommandFailure(f"Kafka error: {text}; is the broker up (make up)?", EXIT_FAILED)
    if isinstance(exc, psycopg.Error | LookupError | RuntimeError | OSError):
        return CommandFailure(first_line(exc), EXIT_FAILED)
    log.debug("unexpected error", exc_info=exc)
    return CommandFailure(
        f"unexpected error ({type(exc).__name__}: {first_line(exc)}); this is a bug of Ductor,"
        " DUCTOR_LOG_LEVEL=DEBUG logs its traceback",
        EXIT_FAILED,
    )
