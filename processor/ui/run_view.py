"""What the run's page shows of what the run was given and gave (pure: from the document of
`inspect -o json`, io/postgres/run_document.py): its input, its steps' outputs, its attempts
(and the failed ones with their error and traceback), and the signals it received.

The attempts are listed as the timeline draws them, by time: by when each started (its
dispatch while a worker has not claimed it; its end for a step no worker runs, a wait or a
child workflow), then by step and attempt; the ones that have not started yet come last.
The document itself lists them by step and attempt (its readers key them so).

Each value is cut already (core/shown.py) and the page escapes everything (pages.py); what is
bounded here is how many of them a page holds: a map step of thousands of items has as many
outputs and may have as many failures, each traceback up to 16 KiB. The page shows the first
ones and says how many there are; `ductor inspect RUN -o json` gives them all.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

# Outputs (in node order) and failed attempts (in time order) shown on a run's page, each:
# the first ones.
OUTPUTS_SHOWN = 100
FAILURES_SHOWN = 20


def attempt_order(attempt: dict[str, Any]) -> tuple[bool, float, str, int]:
    """Where an attempt stands in the page's list: by its start (a worker's claim), else its
    dispatch, else its end; then by step and attempt; none of these times: last."""
    when = attempt.get("started") or attempt.get("dispatched") or attempt.get("ended")
    at = 0.0 if when is None else datetime.fromisoformat(when).timestamp()
    return (when is None, at, attempt["node"], attempt["attempt"])


def run_sections(document: dict[str, Any]) -> dict[str, Any]:
    """The context of the page's input, outputs, attempts, failures and signals sections."""
    outputs = [
        {"node": n["node"], "attempt": n["attempt"], "output": n["output"]}
        for n in document.get("nodes", [])
        if n.get("output") is not None
    ]
    attempts = sorted(document.get("attempts", []), key=attempt_order)
    failures = [a for a in attempts if a.get("error") is not None]
    return {
        "run_input": document.get("input"),
        "attempts": attempts,
        "outputs": outputs[:OUTPUTS_SHOWN],
        "outputs_total": len(outputs),
        "failures": failures[:FAILURES_SHOWN],
        "failures_total": len(failures),
        "signals": document.get("signals", []),
        "signal_count": document.get("signal_count", 0),
    }
