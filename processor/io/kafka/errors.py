"""The broker's refusals that are configuration errors, not outages. Apart from io/kafka/clients.py,
which mypyc compiles: a compiled module cannot define a subclass of RuntimeError."""

from __future__ import annotations


class MissingTopic(RuntimeError):
    """The broker answered, and a topic is not there: the topics were not created (a
    configuration error, not an outage: waiting would not create them)."""


class KafkaAuthError(Exception):
    """The broker refused this client's credentials (a configuration error, not an outage:
    retrying with the same settings cannot help). The message names no secret."""


class DlqError(Exception):
    """A dead-letter operation that could not be done; the message says why
    (io/kafka/dlq.py)."""


class DlqTopicMissing(DlqError):
    """The dead-letter topic to read, or the topic to replay to, does not exist: the topics
    were not created (a configuration error, exit 2 from `ductor dlq`, not one to retry)."""
