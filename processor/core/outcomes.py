"""The names the processor counts, traces and dead-letters with: one owner for each.

To add an outcome or a dead-letter reason, add a member here; the counters, the span
attribute ``ductor.outcome``, the metrics and `ductor dlq list --reason` all take it from here.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """What became of one attempt at a run's wakeups (``ductor.outcome``)."""

    COMMITTED = "committed"  # the tick's new state was written
    NOOP = "noop"  # the tick changed nothing: nothing written
    CONFLICT = "conflict"  # lost a version race: retried, never an error
    LOCKED = "locked"  # another transaction held the run's row: retried, never an error
    REQUEUED = "requeued"  # in-process retries used up: sent to the delay ladder
    FORCE_FAILED = "force_failed"  # livelock or stuck: failed through the terminal path
    DEAD_LETTERED = "dead_lettered"  # a record that cannot be processed went to the DLQ
    HOPPED = "hopped"  # a timer came due on a rung before its target and went on
    # A request from ductor.requests (core/request_plans.py): its row was written (a run
    # started, a signal recorded or kept), or it was found done before (nothing written).
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    ERROR = "error"  # a genuine failure (the database unreachable): retried


class DeadLetterReason(StrEnum):
    """Why a record went to the dead-letter topic (header ``ductor.dlq.reason``)."""

    NOT_JSON = "not_json"
    WRONG_SCHEMA = "wrong_schema"
    UNKNOWN_ENVELOPE_VERSION = "unknown_envelope_version"
    OVERSIZE = "oversize"
    UNKNOWN_RUN = "unknown_run"
    UNKNOWN_WORKFLOW = "unknown_workflow"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    OUT_OF_BOUNDS = "out_of_bounds"  # a value the processor could not store or honour
    POISON = "poison"  # the run made a batched statement fail (its error text says how)
    # A start request for a run id that exists with another workflow or another input.
    CONFLICTING_START = "conflicting_start"
    # A start request whose input does not match its workflow's input schema.
    INVALID_INPUT = "invalid_input"
    # A request outside the scope of the door it came through (the requests topic's
    # DUCTOR_REQUESTS_* settings, a trigger's definition): core/scopes.py.
    NOT_ALLOWED = "not_allowed"
    # A start request for a run id of a shape only Ductor derives (core/run_ids.py).
    RESERVED_RUN_ID = "reserved_run_id"
    # A signal to a run that has ended (it can change nothing any more), or named as no wait
    # step of the run's workflow waits for (a typo: it would change nothing): core/landing.py.
    RUN_ENDED = "run_ended"
    UNKNOWN_SIGNAL = "unknown_signal"
    # Handling this item raised an exception nobody foresaw (a bug, or content no door
    # refused): isolated to it, its exception's type and first line in the detail.
    UNEXPECTED_ERROR = "unexpected_error"


DLQ_REASONS = tuple(r.value for r in DeadLetterReason)


class ForceFailReason(StrEnum):
    """Why a run was force-failed (``ductor.reason``, ``ductor.force_fails``)."""

    LIVELOCK = "livelock"  # kept conflicting without progress
    STUCK = "stuck"  # no transition for longer than DUCTOR_STUCK_AFTER_S
