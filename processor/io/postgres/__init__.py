"""Postgres: the connections, the one classifier of its errors (``db_errors``) and its clock
(``db_clock``), the migrations, and all SQL: the coordinator's hot path (``store``), the
requests, limits, signals, schedules and triggers, the workers' claims and results, the
instance registry and what each worker serves, what a tick's selectors read with the load
(``selected``), the marks kept beside a run's row, never on it (``run_marks``), a run's
document, tags and searches as the CLI, the client and the web page read them, the watchdog's
sweeps, retention."""
