"""What the run's page shows of what the run was given and gave (pure: from the document of
`inspect -o json`, io/postgres/run_document.py): its input, its steps' outputs, its failed
attempts with their error and traceback, and the signals it received.

Each value is cut already (core/shown.py) and the page escapes everything (pages.py); what is
bounded here is how many of them a page holds: a map step of thousands of items has as many
outputs and may have as many failures, each traceback up to 16 KiB. The page shows the first
ones and says how many there are; `ductor inspect RUN -o json` gives them all.
"""

from __future__ import annotations

from typing import Any

# Outputs and failed attempts shown on a run's page, each: the first ones, in node order.
OUTPUTS_SHOWN = 100
FAILURES_SHOWN = 20


def run_sections(document: dict[str, Any]) -> dict[str, Any]:
    """The context of the page's input, outputs, failures and signals sections."""
    outputs = [
        {"node": n["node"], "attempt": n["attempt"], "output": n["output"]}
        for n in document.get("nodes", [])
        if n.get("output") is not None
    ]
    failures = [a for a in document.get("attempts", []) if a.get("error") is not None]
    return {
        "run_input": document.get("input"),
        "outputs": outputs[:OUTPUTS_SHOWN],
        "outputs_total": len(outputs),
        "failures": failures[:FAILURES_SHOWN],
        "failures_total": len(failures),
        "signals": document.get("signals", []),
        "signal_count": document.get("signal_count", 0),
    }
