"""What `ductor inspect` prints of what a run was given and gave, after its status and nodes
(cli/runs.py): its tags, its input, each step's output, every attempt (its start, end, duration and
worker; a failed one's error and traceback) and the signals it received.

Values are compact JSON cut to a bound (core/shown.py); an error and a traceback are a step's
own text, printed with their control characters escaped (a message holding a terminal's
escape sequences cannot move the cursor or recolour the terminal), their line breaks kept.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from datetime import datetime

from processor.core.run_state import NodeState
from processor.io.postgres.run_document import RunRecord, error_message
from processor.io.postgres.run_search import AttemptRow


def printable(text: str, keep: str = "\n\t") -> str:
    """``text`` with its control characters (but those in ``keep``: line breaks and tabs)
    written as escapes."""
    if text.isprintable():
        return text
    return "".join(
        c if c in keep or unicodedata.category(c)[0] != "C" else repr(c)[1:-1] for c in text
    )


def tags_shown(tags: Mapping[str, str], sep: str, keep: str = "\n\t") -> str:
    """A run's tags (given at its start, and set by its steps), ``key=value`` by key, ``sep``
    between them, their control characters (but ``keep``) as escapes; ``-`` for none."""
    if not tags:
        return "-"
    return printable(sep.join(f"{key}={value}" for key, value in sorted(tags.items())), keep)


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.isoformat(timespec="milliseconds")


def tags_line(record: RunRecord) -> str:
    """The run's tags (given at its start, and set by its steps), ``key=value`` by key."""
    return f"tags       {tags_shown(record.columns.tags, '  ')}"


def input_line(record: RunRecord) -> str:
    return f"input      {'-' if record.input is None else record.input.text()}"


def output_lines(record: RunRecord, name: str, node: NodeState) -> list[str]:
    """The line under a node that shows its output, once its current attempt succeeded."""
    for attempt in record.attempts:
        if attempt.node == name and attempt.attempt == node.attempt and attempt.output:
            return [f"  {'':20} output {attempt.output.text()}"]
    return []


def attempt_lines(attempt: AttemptRow, version: int | None = None) -> list[str]:
    """An attempt on one line (when it started and ended, how long it took, on which worker,
    with which version of its function when ``version`` says), then, failed, its error and its
    traceback, indented."""
    started, ended = attempt.started_at, attempt.ended_at
    took = "-" if started is None or ended is None else f"{(ended - started).total_seconds():.3f} s"
    outcome = attempt.outcome or "in flight"
    lines = [
        f"  {attempt.node} #{attempt.attempt}  {outcome}  started {_when(started)}"
        f"  ended {_when(ended)}  took {took}  worker {attempt.worker_id or '-'}"
        + ("" if version is None else f"  version {version}")
    ]
    if attempt.error is not None:
        if attempt.error_type is not None:
            message = error_message(attempt.error, attempt.error_type) or ""
            lines.append(f"    error: {printable(attempt.error_type)}: {printable(message)}")
        else:
            lines.append(f"    error: {printable(attempt.error)}")
    if attempt.traceback is not None:
        lines += ["    " + line for line in printable(attempt.traceback).split("\n")]
    return lines


def print_attempts_and_signals(record: RunRecord) -> None:
    """The run's attempts in node and attempt order, then the signals it received."""
    if record.attempts:
        print("attempts:")
        # The versions its attempts ran with, once any is not 1 (core/versions.py).
        run = record.run
        pinned = not isinstance(run, Exception) and bool(run.state.versions)
        ran = {key: e.version for key, e in record.executions.items()}
        versioned = pinned or any(v not in (None, 1) for v in ran.values())
        for attempt in record.attempts:
            key = (attempt.node, attempt.attempt)
            version = (ran.get(key) or 1) if versioned and attempt.worker_id else None
            for line in attempt_lines(attempt, version):
                print(line)
    signals = record.signals
    if signals.total:
        more = "" if signals.total == len(signals.shown) else f", the first {len(signals.shown)}"
        print(f"signals ({signals.total}{more}):")
        for s in signals.shown:
            what = f"{s.name}  {printable(s.signal_id)}"
            print(f"  {_when(s.received_at)}  {what}  {s.payload.text()}")
