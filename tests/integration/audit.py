"""Checks over the audit trail of run-row writes (see the `audit` fixture); they live in
processor/tools/audit.py, shared with the chaos run."""

from processor.tools.audit import (
    assert_results_applied,
    assert_transitions_applied_once,
    timed_out_attempts,
)

__all__ = ["assert_results_applied", "assert_transitions_applied_once", "timed_out_attempts"]
