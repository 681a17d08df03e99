"""A failed attempt as it is kept (pure): its exception's message and its traceback, bounded,
and the traceback starting at the user's step code.

Both are stored with the attempt's result (``eec_step_result.error``, ``.traceback``) and the
message also in the run's state (a failed node's ``error``, the run's failure reason), which
every commit of the run writes: so neither may grow with what a step raises. A message is cut
after MAX_ERROR_CHARS characters; a traceback keeps at most MAX_TRACEBACK_LINES lines and
MAX_TRACEBACK_BYTES bytes: its first lines (where the step was entered) and as many of its
last ones as fit (where the exception was raised, and the exception itself), each line cut
after TRACEBACK_LINE_CHARS characters, and a line in between that says how many were left out.

The worker catches a step's exception in its own function (worker/steps.py), so the
traceback's first frames are the worker's: ``first_user_frame`` says where the user's begin.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

MAX_ERROR_CHARS = 4000
MAX_TRACEBACK_LINES = 80
MAX_TRACEBACK_BYTES = 16 * 1024
TRACEBACK_LINE_CHARS = 400
# The share of the bounds the first lines may take; the rest goes to the last lines.
_HEAD_SHARE = 4


def bounded_error(text: str, max_chars: int = MAX_ERROR_CHARS) -> str:
    """``text`` whole up to ``max_chars`` characters; else its start and how long it was."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}… ({len(text)} characters)"


def no_traceback(why: str) -> str:
    """What an attempt whose process died under its step keeps instead of a traceback."""
    return (
        f"No traceback: {why}. The process ended before a Python exception could be kept"
        " (a crash in native code, os._exit, a kill, the out-of-memory killer); the worker's"
        " log and the machine's (dmesg) may say more."
    )


def first_user_frame(filenames: Sequence[str], own: Collection[str]) -> int:
    """The index of the first frame whose file is not one of ``own`` (the worker's), in a
    traceback's frames (outermost first); 0 when every frame is the worker's (the worker
    itself failed: all of them say where)."""
    for i, name in enumerate(filenames):
        if name not in own:
            return i
    return 0


def _size(line: str) -> int:
    """The bytes ``line`` takes stored (UTF-8), and its line break."""
    return len(line.encode("utf-8", "backslashreplace")) + 1


def _cut(line: str, max_chars: int) -> str:
    if len(line) <= max_chars:
        return line
    return f"{line[:max_chars]}… ({len(line)} characters)"


def bounded_traceback(
    text: str,
    max_lines: int = MAX_TRACEBACK_LINES,
    max_bytes: int = MAX_TRACEBACK_BYTES,
    line_chars: int = TRACEBACK_LINE_CHARS,
) -> str:
    """``text`` (a formatted traceback) within ``max_lines`` lines and ``max_bytes`` bytes
    (UTF-8): whole when it fits; else its first lines, a line saying how many were left out,
    and its last lines (the exception is last). Each line is cut after ``line_chars``
    characters. ``max_bytes`` must leave room for a few lines of ``line_chars``."""
    lines = [_cut(line, line_chars) for line in text.rstrip("\n").split("\n")]
    if len(lines) <= max_lines and sum(_size(line) for line in lines) <= max_bytes:
        return "\n".join(lines)
    room_lines = max_lines - 1  # (the line that says what was left out)
    room_bytes = max_bytes - _size(f"  ... ({len(lines)} lines left out) ...")
    head: list[str] = []
    used = 0
    for line in lines[: room_lines // _HEAD_SHARE]:
        if used + _size(line) > room_bytes // _HEAD_SHARE:
            break
        head.append(line)
        used += _size(line)
    tail: list[str] = []
    for line in reversed(lines[len(head) :]):
        if len(head) + len(tail) >= room_lines or used + _size(line) > room_bytes:
            break
        tail.append(line)
        used += _size(line)
    tail.reverse()
    left_out = len(lines) - len(head) - len(tail)
    return "\n".join([*head, f"  ... ({left_out} lines left out) ...", *tail])
