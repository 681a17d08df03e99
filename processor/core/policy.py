"""The conflict policy of the seed, as pure decisions.

A lost version race (a conflict) is an expected outcome of healthy concurrency, never an error:

1. In process, a run gets up to five tries, at 0, 10 ms, 20 ms, 40 ms and 1 s; each one
   re-loads the run and recomputes its tick from fresh state.
2. Then the run is requeued to the delay topic of 100 ms * 2^n (capped at 10 s), keyed
   ``run_id:requeue_seq`` (``requeue_seq`` distinct per requeue), and the requeue count rides on the
   envelope, never on the row.
3. The count only grows while the run makes no progress: if the run's ``last_transition_seq``
   moved since the previous requeue, someone committed a transition and the count restarts.
4. After ``livelock_requeues`` non-progressing requeues, the run is force-failed ("livelock")
   through the same terminal path as the stuck-run watchdog.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.core.outcomes import ForceFailReason
from processor.core.routing import requeue_delay_ms

# Wait before in-process try k+1 (k from 0): the first try is immediate.
IN_PROCESS_BACKOFF_MS = (0, 10, 20, 40, 1000)
MAX_IN_PROCESS_TRIES = len(IN_PROCESS_BACKOFF_MS)


def retry_wait_ms(tries_made: int) -> int | None:
    """How long to wait before the next in-process try, or None when they are used up."""
    if tries_made >= MAX_IN_PROCESS_TRIES:
        return None
    return IN_PROCESS_BACKOFF_MS[tries_made]


@dataclass(frozen=True)
class NextRequeue:
    requeue_count: int  # goes on the new envelope
    requeue_seq: int  # the new envelope's: the key is run_id:requeue_seq
    delay_ms: int  # which rung of the delay ladder
    observed_seq: int  # the run's seq now, so the next round can tell whether it progressed


@dataclass(frozen=True)
class ForceFail:
    reason: ForceFailReason
    requeues: int


def after_exhausted_conflicts(
    *,
    requeue_count: int,
    requeue_seq: int,
    observed_seq: int | None,
    current_seq: int,
    livelock_requeues: int,
) -> NextRequeue | ForceFail:
    """Decide what follows once the in-process tries are used up."""
    progressed = observed_seq is None or current_seq != observed_seq
    non_progressing = 0 if progressed else requeue_count
    if non_progressing >= livelock_requeues:
        return ForceFail(reason=ForceFailReason.LIVELOCK, requeues=non_progressing)
    return NextRequeue(
        requeue_count=non_progressing + 1,
        requeue_seq=requeue_seq + 1,
        delay_ms=requeue_delay_ms(non_progressing),
        observed_seq=current_seq,
    )
