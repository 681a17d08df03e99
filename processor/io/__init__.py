"""The shell's adapters: Kafka clients and topics, Postgres (all SQL is in ``store``), the
migrations, telemetry, logs and configuration. They import the core, never the engine."""
