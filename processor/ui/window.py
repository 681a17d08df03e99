"""How much history one look of the web page reads (pure: ``now`` is an argument).

The runs page counts the runs its filter matches and the dead-letters page reads the topic
for the letters of one reason: both would read all of history if nothing bounded them, so
every look reads a window of time. Its end is the form's Until (default: now); its start is
the form's Since, or ``DUCTOR_UI_WINDOW_S`` before the end; a window longer than
``DUCTOR_UI_MAX_WINDOW_S`` is refused with what to do instead (narrow it, or ask the
commands, which read any span).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """``since_ms`` (inclusive) to ``until_ms`` (exclusive; None: now, and whatever comes
    while the page is read), epoch milliseconds."""

    since_ms: int
    until_ms: int | None


def window(
    since_ms: int | None,
    until_ms: int | None,
    *,
    now_ms: int,
    default_s: float,
    max_s: float,
    instead: str,
) -> Window:
    """The window of a look whose form gave ``since_ms``/``until_ms`` (None: not given).
    ValueError saying why it is refused; ``instead`` names the command that reads further."""
    end = now_ms if until_ms is None else until_ms
    start = end - round(default_s * 1000) if since_ms is None else since_ms
    if start >= end:
        raise ValueError("Since must be before Until")
    if end - start > round(max_s * 1000):
        raise ValueError(
            f"the page reads at most {span(max_s)} at a time (DUCTOR_UI_MAX_WINDOW_S), and"
            f" Since to Until is {span((end - start) / 1000)}: narrow them, or use {instead}"
        )
    return Window(start, until_ms)


def span(seconds: float) -> str:
    """A duration as a person says it: ``7 days``, ``36 hours``, ``90 seconds``."""
    for unit, length in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= length and seconds % length == 0:
            count = int(seconds // length)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds:g} seconds"


def as_duration(seconds: float) -> str:
    """``seconds`` as the form's Since field takes a duration (``1d``, ``6h``, ``90s``)."""
    for suffix, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length and seconds % length == 0:
            return f"{int(seconds // length)}{suffix}"
    return f"{round(seconds)}s"
