"""Postgres: the connections, the one classifier of its errors (``db_errors``) and its clock
(``db_clock``), the migrations, and all SQL: the coordinator's hot path (``store``), the
requests, limits, signals, schedules and triggers, the workers' claims and results, the
instance registry, the queries of the CLI, the client and the watchdog, retention."""
