"""The run ids Ductor derives, and which no start may take (docs/requests.md#reserved-run-ids).

A schedule's fire is run ``NAME@TIME`` (core/schedules.py) and a child run is
``PARENT/STEP#N`` (core/children.py): each is inserted idempotently under its id, so a run a
start created under that id first would stand in its place. A start of ``nightly@<next
fire>`` swallowed the fire (the schedule found its run there already and started nothing); a
start of ``order-1/ship#1`` became the parent's child before the parent dispatched it (the
parent waited for a run that did not know it, up to its step's timeout, and cancelled it).
So these shapes are a namespace of their own: every door that starts a run (the requests
topic, a trigger, ``ductor start``, the client) refuses them, and only the schedules and the
parents' commits write them. A signal may name one: cancelling a child or a schedule's run, or
approving its wait step, is what they are for.

Exactly these shapes are refused, and ``@``, ``/`` and ``#`` are free elsewhere in a run id
(``ada@example.com``, ``orders/2026/1001``, ``ticket#12``):

- ``PARENT/STEP#N``: any text, ``/``, any text, ``#`` and an attempt number (1, 2, ...: no
  leading zero): a child run's id;
- 199 characters ending with ``~`` and 16 lowercase hexadecimal digits: a child run's id
  shortened to fit ``MAX_RUN_ID_LENGTH`` (``children.child_run_id``);
- ``NAME@TIME`` and ``NAME@manual-TIME``, NAME a schedule's possible name (a letter or digit,
  then up to 99 letters, digits, ``_``, ``.`` or ``-``) and TIME a UTC time written as the
  schedules write it (``2026-12-04T02:00:00Z``, or with milliseconds ``...:00.250Z``).
"""

from __future__ import annotations

import re

from processor.core.envelope import MAX_RUN_ID_LENGTH

# Digest and marker of a shortened child id: its last 17 characters (children.child_run_id).
_SHORTENED_TAIL = 17
_CHILD = re.compile(r".+/.+#[1-9][0-9]*", re.DOTALL)
_SHORTENED_CHILD = re.compile(
    f".{{{MAX_RUN_ID_LENGTH - 1 - _SHORTENED_TAIL}}}~[0-9a-f]{{16}}", re.DOTALL
)
_FIRE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}@(?:manual-)?"
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{3})?Z"
)


def reserved_shape(run_id: str) -> str | None:
    """What derived run id ``run_id`` has the shape of (a phrase), or None when a start may
    take it."""
    if _FIRE.fullmatch(run_id):
        return "a schedule's run (NAME@TIME)"
    if _CHILD.fullmatch(run_id) or _SHORTENED_CHILD.fullmatch(run_id):
        return "a child run (PARENT/STEP#N)"
    return None


def reserved_problem(run_id: str) -> str | None:
    """The sentence a door refuses a start of ``run_id`` with, or None."""
    shape = reserved_shape(run_id)
    if shape is None:
        return None
    return (
        f"run_id {run_id!r} has the shape of the id of {shape}, which only Ductor gives a"
        " run: start it under another id (docs/requests.md#reserved-run-ids)"
    )
