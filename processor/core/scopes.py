"""Scopes: what one door of the intake may ask for (docs/requests.md#who-may-do-what).

A door is the requests topic, whose scope the operator sets (the ``DUCTOR_REQUESTS_*``
settings), or a trigger, whose scope is its own definition (the one workflow it starts or the
one signal it sends, to run ids under its prefix: core/triggers.py, ``trigger_scope``). A
scope names:

- the workflows a start may name;
- the prefixes a run id must begin with, for starts and signals alike: a signal names the run
  it is for by its id alone, so the prefixes are what says which runs a door may reach;
- the signals it may send (``cancel`` among them, or not).

``None`` is any (the requests topic's default: unscoped, as it was before scopes existed); an
empty tuple is none. A request outside its door's scope is refused as a value, before anything
is written: ``Rejected`` with ``not_allowed`` and a detail naming the door and what it may do,
dead-lettered like any record that cannot be honoured.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.core.envelope import MAX_RUN_ID_LENGTH, Rejected
from processor.core.outcomes import DeadLetterReason
from processor.core.requests import MAX_NAME_LENGTH, Request, StartRequest
from processor.core.workflow_def import SIGNAL_NAME

ANY_TEXT = "*"  # a scope's list written as text: any


@dataclass(frozen=True)
class Scope:
    """What one door may ask for (``None``: any; ``()``: none). ``door`` names it in the
    dead letters' detail."""

    door: str
    workflows: tuple[str, ...] | None = None
    run_id_prefixes: tuple[str, ...] | None = None
    signals: tuple[str, ...] | None = None

    @property
    def unscoped(self) -> bool:
        """Any workflow, any run id, any signal."""
        return self.workflows is None and self.run_id_prefixes is None and self.signals is None

    def describe(self) -> str:
        """One line: what the door may do."""
        if self.unscoped:
            return f"{self.door}: unscoped (any workflow, any signal, any run id)"
        prefixes = self.run_id_prefixes
        if prefixes is None:
            runs = "any run id"
        elif not prefixes:
            runs = "no run id"
        else:
            runs = f"run ids beginning with {_listed(prefixes, 'prefix')}"
        return (
            f"{self.door}: may start {_listed(self.workflows, 'workflow')}; may send"
            f" {_listed(self.signals, 'signal')}; reaches {runs}"
        )


# The requests topic's scope when the operator sets none.
ANY_DOOR = Scope("the requests topic")


def scope_refusal(scope: Scope, request: Request) -> Rejected | None:
    """Why ``request`` is outside ``scope`` (a ``not_allowed`` rejection), or None."""
    if isinstance(request, StartRequest):
        if scope.workflows is not None and request.workflow not in scope.workflows:
            return _not_allowed(
                f"{scope.door} may not start workflow {request.workflow!r}: it may start"
                f" {_listed(scope.workflows, 'workflow')}"
            )
    elif scope.signals is not None and request.name not in scope.signals:
        return _not_allowed(
            f"{scope.door} may not send signal {request.name!r}: it may send"
            f" {_listed(scope.signals, 'signal')}"
        )
    prefixes = scope.run_id_prefixes
    if prefixes is not None and not request.run_id.startswith(prefixes):
        what = "start" if isinstance(request, StartRequest) else "signal"
        reach = f"its run ids begin with {_listed(prefixes, 'prefix')}" if prefixes else ""
        return _not_allowed(
            f"{scope.door} may not {what} run {request.run_id!r}: {reach or 'it may reach no run'}"
        )
    return None


def _not_allowed(detail: str) -> Rejected:
    return Rejected(DeadLetterReason.NOT_ALLOWED, detail)


def _listed(items: tuple[str, ...] | None, noun: str) -> str:
    if items is None:
        return f"any {noun}"
    if not items:
        return f"no {noun}"
    return ", ".join(repr(i) for i in items)


# -- the lists as an operator writes them ---------------------------------------------------

# What each list holds, and what one of its items must be.
SCOPE_KINDS = ("workflows", "run_id_prefixes", "signals")


def parse_scope_list(kind: str, text: str) -> tuple[str, ...] | None:
    """A scope's list from its text: ``*`` is any (None), empty is none, else items separated
    by commas (spaces around them dropped, repeats once). ValueError says what is wrong."""
    text = text.strip()
    if text == ANY_TEXT:
        return None
    if not text:
        return ()
    items: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        problem = _item_problem(kind, item)
        if problem:
            raise ValueError(problem)
        if item not in items:
            items.append(item)
    return tuple(items)


def format_scope_list(items: tuple[str, ...] | None) -> str:
    """The text ``parse_scope_list`` reads back as ``items``."""
    return ANY_TEXT if items is None else ",".join(items)


def _item_problem(kind: str, item: str) -> str | None:
    if not item:
        return "an empty item (two commas in a row, or one at an end): list names, '*' or nothing"
    if item == ANY_TEXT:
        return "'*' stands alone (any); it is not an item of a list"
    if "\x00" in item:
        return "an item holds a NUL character"
    if kind == "workflows":
        if len(item) > MAX_NAME_LENGTH:
            return f"workflow {item[:20]!r}... is longer than {MAX_NAME_LENGTH} characters"
        return None
    if kind == "run_id_prefixes":
        if len(item) >= MAX_RUN_ID_LENGTH:
            return f"prefix {item[:20]!r}... is as long as a run id may be ({MAX_RUN_ID_LENGTH})"
        return None
    if kind == "signals":
        if not SIGNAL_NAME.fullmatch(item):
            return (
                f"{item!r} is not a signal name (cancel, or 1 to 100 letters, digits, '_', '.',"
                " ':' or '-', starting with a letter or digit)"
            )
        return None
    raise ValueError(f"unknown kind of scope list {kind!r}")
