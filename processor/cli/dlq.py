"""Commands about dead letters: dlq list, dlq replay."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from processor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from processor.cli.grammar import emit, print_json_lines
from processor.core.outcomes import DLQ_REASONS
from processor.core.routing import TopicNames
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import (
    DeadLetter,
    fetch_dead_letter,
    read_dead_letters,
    replay,
)
from processor.io.kafka.errors import DlqError, DlqTopicMissing


def register(sub: Any) -> None:
    dlq = sub.add_parser("dlq", help="list and replay dead-lettered records")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    p = dlq_sub.add_parser(
        "list",
        help="print the dead letters from the beginning, one line each: dlq partition:offset,"
        " reason, source topic[partition]@offset, key, value excerpt, detail",
    )
    p.add_argument("--limit", type=int, help="print at most N records (the first N read)")
    p.add_argument("--reason", choices=DLQ_REASONS, help="only records dead-lettered for R")
    p.set_defaults(func=cmd_dlq_list)
    p = dlq_sub.add_parser(
        "replay",
        help="produce a dead letter again to its source topic, with its key and headers"
        " (without the ductor.dlq.* ones)",
    )
    p.add_argument("dlq_offset", type=int, help="the record's offset in the dead-letter topic")
    p.add_argument("--partition", type=int, default=0, help="its dead-letter partition (0)")
    p.add_argument("--value-file", help="send this file's bytes as the value instead")
    p.add_argument(
        "--force",
        action="store_true",
        help="replay even a value the processor would dead-letter again",
    )
    p.set_defaults(func=cmd_dlq_replay)


def _letter_json(letter: DeadLetter) -> dict[str, Any]:
    return {
        "partition": letter.partition,
        "offset": letter.offset,
        "reason": letter.reason,
        "source_topic": letter.source_topic,
        "source_partition": letter.source_partition,
        "source_offset": letter.source_offset,
        "key": letter.key_excerpt(),
        "value": letter.value_excerpt(),
        "detail": letter.detail_line(),
        "copies": letter.copies,
    }


def _code(exc: DlqError) -> int:
    """A topic that does not exist is configuration (2); anything else failed (1)."""
    return EXIT_USAGE if isinstance(exc, DlqTopicMissing) else EXIT_FAILED


def cmd_dlq_list(settings: Settings, args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be at least 1", EXIT_USAGE)
    try:
        letters = read_dead_letters(settings, reason=args.reason, limit=args.limit)
    except DlqError as exc:
        raise CliError(str(exc), _code(exc)) from None
    if args.output == "json":
        print_json_lines([_letter_json(letter) for letter in letters])
    for letter in letters if args.output == "text" else ():
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
        raise CliError(str(exc), _code(exc)) from None
    source = "a fixed value" if value is not None else "its original value"
    document = {
        "dlq_partition": letter.partition,
        "dlq_offset": letter.offset,
        "topic": done.topic,
        "partition": done.partition,
        "offset": done.offset,
    }
    emit(
        args,
        document,
        f"replayed {letter.partition}:{letter.offset} ({letter.reason}) with {source}"
        f" to {done.topic} partition {done.partition} offset {done.offset}",
    )
    return EXIT_OK
