"""Kafka: the clients and the one produce helper (``clients``), delivery until acknowledged,
the broker's refusals that are configuration errors, librdkafka's log lines, topic creation,
the dead-letter topic, and the looks at consumer groups."""
