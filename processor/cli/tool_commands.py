"""`ductor demo` and `ductor bench`. The demo and the benchmark (processor/tools) are imported
only when one of these commands runs, so every other command starts without them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from processor.cli.common import CliError
from processor.io.config.settings import Settings


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
