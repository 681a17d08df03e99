"""What a tick decides (core/tick.py): the new state, or none (a no-op), and what the shell
must do besides writing it. Pure values.
"""

from __future__ import annotations

from typing import NamedTuple

from processor.core.run_state import RunState
from processor.core.shapes import AttemptRef


# Dispatch and Decision are NamedTuples (immutable, compared and hashed in C): a tick makes
# several, and a frozen dataclass's __init__ sets each field through object.__setattr__.
class Dispatch(NamedTuple):
    """A step attempt to send to the workers. ``deadline_ms``: its dispatch plus its timeout
    (what a worker from before start-to-close takes for its deadline: core/step_task.py)."""

    node: str
    attempt: int
    step_type: str
    deadline_ms: int


class Decision(NamedTuple):
    """What the shell must do. ``new_state is None`` means no-op: write nothing, send nothing."""

    new_state: RunState | None
    dispatches: tuple[Dispatch, ...] = ()
    timers: tuple[int, ...] = ()  # epoch ms at which a retry wait ends and the run must be woken
    # Wait steps this tick ended, each with the signal that ended it: (node, attempt, signal id)
    signalled: tuple[tuple[str, int, str], ...] = ()
    # Map steps this tick ended succeeded: (node, attempt, how many items).
    mapped: tuple[tuple[str, int, int], ...] = ()
    # Map items this tick took out of the state, succeeded: (map step, index, attempt).
    items_done: tuple[tuple[str, int, int], ...] = ()
    # Attempts this tick failed that no worker had started (a schedule-to bound passed in the
    # queue): (node, attempt). The commit holds only if none was started meanwhile: it marks
    # each one never to be started (io/postgres/store.py), as a claim would mark it started.
    unstarted: tuple[AttemptRef, ...] = ()
    # Steps this tick ended succeeded with an output it made itself, (node, attempt, output
    # as JSON text): a sleep's (core/sleeps.py), a wait's default when it continued on its
    # timeout. The commit records each as the step's result.
    settled: tuple[tuple[str, int, str], ...] = ()

    @property
    def progressed(self) -> bool:
        return self.new_state is not None


NOOP = Decision(new_state=None)
