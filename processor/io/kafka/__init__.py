"""Kafka: the clients and the one produce helper (``clients``), each client's configuration,
the consumers' offsets, delivery until acknowledged, the broker's refusals that are
configuration errors, librdkafka's log lines, topic creation, the dead-letter topic, the looks
at consumer groups, and the workers' group's session timeout.
"""
