"""The ``ductor`` command line (see main.py).

The installed ``ductor`` script and ``python -m processor`` both enter through ``main`` here,
which keeps a SIGTERM (or Ctrl-C) that comes while the modules load (early_stop.py) before it
loads them: the service then stops cleanly instead of dying by the signal.

Each family of commands is a module of its own that registers its subcommands (``services``:
migrate, topics, process, worker; ``start``; ``runs`` and ``run_text``: inspect, signal,
result; ``search``: runs list, count, cancel, retry; ``workflows``, ``workers``,
``schedules``, ``triggers``, ``dlq``, ``outbox``, ``config``, ``gc``, ``ui``, ``completion``;
``tool_commands``: the demo and the benchmark). What every command's line shares is
``grammar`` and ``common``; ``errors`` is the one place an exception becomes the sentence
printed and the exit code.
"""

from __future__ import annotations

from collections.abc import Sequence

from processor.cli import early_stop

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    early_stop.keep()  # before the modules load: a SIGTERM meanwhile stops the command cleanly
    early_stop.loading_fault()

    from processor.cli.main import main as run  # noqa: PLC0415 (loads everything: after keep)

    return run(argv)
