"""Checks over the audit trail of run-row writes (see the `audit` fixture); they live in
processor/tools/audit.py, shared with the chaos run."""

from processor.tools.audit import (
    assert_every_write_versioned,
    assert_results_applied,
    assert_transitions_applied_once,
    timed_out_attempts,
    unversioned_writes,
)

__all__ = [
    "assert_every_write_versioned",
    "assert_results_applied",
    "assert_transitions_applied_once",
    "timed_out_attempts",
    "unversioned_writes",
]
