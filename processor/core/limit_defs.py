"""What a step may declare to bound its dispatches (docs/usage.md#limits): a concurrency limit
(at most ``limit`` attempts in flight at once, per value of a path in the run's input) and a
rate limit (at most ``limit`` attempts dispatched in any ``per_ms`` window). A limit is named
(the step's type by default): every step declaring a limit of that name shares it, whatever
its workflow, so one name means one limit and should be declared alike everywhere.

A workflow may bound its runs (``RunKeyLimit``): at most ``limit`` live runs (started, not
ended) per value of a path in the run's input, the others pending in line (core/run_keys.py).

The counting is core/limits.py's; these are the definitions, parsed in core/workflow.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# A limit's name goes into its keys (`c/NAME/VALUE`, `r/NAME`): no '/' in it.
LIMIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
MAX_LIMIT = 100_000


@dataclass(frozen=True)
class ConcurrencyLimit:
    """At most ``limit`` attempts of the steps sharing ``name`` in flight at once, counted
    apart for each value of ``key`` (a path in the run's input; () counts every run alike)."""

    name: str
    limit: int
    key: tuple[str, ...] = ()

    def key_of(self, value: str) -> str:
        """The counter of this limit for a run whose input holds ``value`` at ``key``."""
        return f"c/{self.name}/{value}"

    def to_json(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"name": self.name, "limit": self.limit}
        if self.key:
            raw["key"] = ".".join(self.key)
        return raw


@dataclass(frozen=True)
class RunKeyLimit:
    """At most ``limit`` runs of the workflow ``workflow`` (any version) live at once per value
    of ``key`` (a path in the run's input; () counts every run alike): a run holds its slot
    from the tick that starts it to the commit that ends it."""

    workflow: str
    limit: int
    key: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The limit's name, as metrics and ``ductor inspect`` label it."""
        return f"run:{self.workflow}"

    def key_of(self, value: str) -> str:
        """The counter of this limit for a run whose input holds ``value`` at ``key`` (the
        name's length first: a workflow's name may hold '/')."""
        return f"k/{len(self.workflow)}/{self.workflow}/{value}"

    def to_json(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"limit": self.limit}
        if self.key:
            raw["key"] = ".".join(self.key)
        return raw


@dataclass(frozen=True)
class StepRateLimit:
    """At most ``limit`` attempts of the steps sharing ``name`` dispatched in any window of
    ``per_ms`` milliseconds."""

    name: str
    limit: int
    per_ms: int

    @property
    def counter(self) -> str:
        return f"r/{self.name}"

    def to_json(self) -> dict[str, Any]:
        per_s: float | int = self.per_ms / 1000
        if self.per_ms % 1000 == 0:
            per_s = self.per_ms // 1000
        return {"name": self.name, "limit": self.limit, "per_s": per_s}
