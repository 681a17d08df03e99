"""`ductor demo` and `ductor bench`. The demo and the benchmark (processor/tools) are imported
only when one of these commands runs, so every other command starts without them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from processor.cli.common import CliError
from processor.io.config.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="the whole system live: infra, 2 processors, a worker, thousands of runs"
    )
    p.add_argument(
        "--runs", type=int, default=3000, help="sample runs to start (plus hot, failing, cancelled)"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    p.set_defaults(func=cmd_demo, json_refused="the demo shows itself live")
    # The benchmark's options are its own (see parse_bench_arguments): `ductor bench --help`
    # lists them.
    p = sub.add_parser(
        "bench", help="the benchmark (same as `make bench`); prints figures", add_help=False
    )
    p.set_defaults(func=cmd_bench, json_refused="the benchmark writes its own report")


def parse_bench_arguments(argv: Sequence[str], namespace: argparse.Namespace) -> argparse.Namespace:
    """Parse the benchmark's own options (defined once, in processor/tools/bench.py) into
    ``namespace``; exits 2 with the usage of `ductor bench` on a bad one, as argparse does."""
    from processor.tools.bench import add_arguments  # noqa: PLC0415 (only `ductor bench`)

    parser = argparse.ArgumentParser(prog="ductor bench")
    add_arguments(parser)
    return parser.parse_args(argv, namespace=namespace)


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from processor.tools.demo import ServicesDown, run_demo  # noqa: PLC0415 (only `ductor demo`)

    try:
        return run_demo(settings, runs=args.runs, timeout_s=args.timeout)
    except ServicesDown as exc:
        raise CliError(str(exc)) from None


def cmd_bench(settings: Settings, args: argparse.Namespace) -> int:
    from processor.tools.bench import run  # noqa: PLC0415 (only `ductor bench`)

    return run(args)
