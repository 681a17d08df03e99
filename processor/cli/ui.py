"""`ductor ui`: serve the web page (processor/ui) until SIGTERM or SIGINT.

The page's libraries are the ``ui`` extra, loaded only by this command: the other commands,
and an install without the extra, never import them."""

from __future__ import annotations

import argparse
from typing import Any

from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError, stop_on_signals
from processor.io.config.settings import Settings

INSTALL_HINT = "pip install 'ductor-processor[ui]'"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "ui",
        help="serve a read-only web page of the runs (filters, each run's DAG and attempts),"
        " dead letters and schedules; retry and cancel with DUCTOR_UI_TOKEN; and a JSON API"
        " to start, signal, cancel, retry and find runs (/api/openapi.json)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only)",
    )
    p.add_argument("--port", type=int, default=8080, help="the port (default 8080; 0: any free)")
    p.set_defaults(func=cmd_ui, handles_signals=True, json_refused="a service logs")


def cmd_ui(settings: Settings, args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be between 0 and 65535, not {args.port}", EXIT_USAGE)
    try:
        from processor.ui.server import UiServer  # noqa: PLC0415 (the optional extra)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "processor":
            raise
        raise CliError(
            f"ductor ui needs the ui extra ({exc.name} is not installed): {INSTALL_HINT}",
            EXIT_USAGE,
        ) from None
    server = UiServer(settings, args.host, args.port)
    stop_on_signals(server.stop)
    server.run()
    return EXIT_OK
