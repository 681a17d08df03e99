"""The exit codes a service gives its supervisor when it stops itself, or is ended, for a fresh
process to start (the CLI's table, cli/grammar.py's EXIT_TABLE, lists them beside the
codes every command shares). Here, apart from the code that exits with them, so that the
command line can print the table without loading the services."""

from __future__ import annotations

# A Kafka client reported a fatal error (io/kafka/clients.py): the client cannot go on, a
# fresh process can.
EXIT_KAFKA_FATAL = 4
# Too many abandoned steps still running (worker/worker.py, --max-abandoned): threads cannot
# be killed, a fresh process has none.
EXIT_ABANDONED = 5
# Its stop overran the shutdown timeout (cli/common.py's STOP_OVERRUN_S): 128 + SIGALRM.
EXIT_STOP_OVERRAN = 142

__all__ = ["EXIT_ABANDONED", "EXIT_KAFKA_FATAL", "EXIT_STOP_OVERRAN"]
