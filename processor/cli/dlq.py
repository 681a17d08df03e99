"""Commands about dead letters: dlq list, dlq replay."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError
from processor.core.routing import TopicNames
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import DlqError, fetch_dead_letter, read_dead_letters, replay


def cmd_dlq_list(settings: Settings, args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be at least 1", EXIT_USAGE)
    try:
        letters = read_dead_letters(settings, reason=args.reason, limit=args.limit)
    except DlqError as exc:
        raise CliError(str(exc)) from None
    for letter in letters:
        print(letter.describe())
    # The count goes to stderr, so stdout stays exactly one line per record for scripts.
    which = f" with reason {args.reason}" if args.reason else ""
    topic = TopicNames(settings.topic_prefix).dlq
    again = sum(1 for letter in letters if letter.copies > 1)
    resent = (
        f" ({again} of them dead-lettered again by the instance that redid the record after"
        " a crash: listed once)"
        if again
        else ""
    )
    print(f"{len(letters)} dead letter(s){which} listed from {topic}{resent}", file=sys.stderr)
    return EXIT_OK


def cmd_dlq_replay(settings: Settings, args: argparse.Namespace) -> int:
    if args.dlq_offset < 0 or args.partition < 0:
        raise CliError("the offset and --partition must not be negative", EXIT_USAGE)
    value: bytes | None = None
    if args.value_file:
        try:
            value = Path(args.value_file).read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read {args.value_file}: {exc.strerror}", EXIT_USAGE) from None
    try:
        letter = fetch_dead_letter(settings, args.partition, args.dlq_offset)
        done = replay(settings, letter, value, force=args.force)
    except DlqError as exc:
        raise CliError(str(exc)) from None
    source = "a fixed value" if value is not None else "its original value"
    print(
        f"replayed {letter.partition}:{letter.offset} ({letter.reason}) with {source}"
        f" to {done.topic} partition {done.partition} offset {done.offset}"
    )
    return EXIT_OK
