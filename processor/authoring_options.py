"""The options of a step written in Python (processor/authoring.py), in that API's terms: a
retry policy and limits with durations as text, resolved into the definition's values when
the workflow's definition is asked for. Nothing here touches a service."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from processor.core.durations import Duration, duration_ms, optional_ms
from processor.core.limit_defs import ConcurrencyLimit, RunKeyLimit, StepRateLimit
from processor.core.routing import DEFAULT_QUEUE
from processor.core.step_parse import concurrency_key
from processor.core.workflow_def import RetryPolicy, StepDef, ValidationError


@dataclass(frozen=True)
class Retry:
    """A step's retry policy: at most ``max_attempts`` attempts, the n-th retry waiting
    ``backoff * multiplier ** (n - 1)``, never more than ``max_backoff``."""

    max_attempts: int = 3
    backoff: Duration = 100
    multiplier: float = 2.0
    max_backoff: Duration = "60s"

    def policy(self) -> RetryPolicy:
        """The policy as the definition holds it."""
        return RetryPolicy(
            max_attempts=self.max_attempts,
            backoff_ms=duration_ms(self.backoff, "retry.backoff"),
            backoff_multiplier=float(self.multiplier),
            max_backoff_ms=duration_ms(self.max_backoff, "retry.max_backoff"),
        )


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` attempts of the step in flight at once across runs, counted apart
    per value of ``key`` (a dotted path in the run's input, e.g. ``"customer.id"``) when
    given. Steps naming the same limit (``name``; the step's type by default) share it."""

    limit: int
    key: str | None = None
    name: str | None = None

    def limit_of(self, step_type: str, where: str) -> ConcurrencyLimit:
        """The limit as the definition of a step of type ``step_type`` holds it (``where``:
        the step's place in the definition, for a key that is not a path)."""
        name = self.name if self.name is not None else step_type
        key = concurrency_key(self.key or "", f"{where}.concurrency")
        return ConcurrencyLimit(name, self.limit, key)

    def run_limit_of(self, workflow: str) -> RunKeyLimit:
        """The limit as a workflow's ``concurrency`` holds it: at most ``limit`` live runs of
        ``workflow`` per value of ``key`` (a limit of runs takes no ``name``)."""
        if self.name is not None:
            raise ValidationError(
                "workflow.concurrency: a workflow's limit takes no name (it is its workflow's)"
            )
        return RunKeyLimit(
            workflow, self.limit, concurrency_key(self.key or "", "workflow.concurrency")
        )


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` attempts of the step dispatched in any window of ``per`` (a
    duration: ``"1m"``, ``"1s"``, milliseconds as a number), across runs; shared by name."""

    limit: int
    per: Duration = "1s"
    name: str | None = None

    def limit_of(self, step_type: str) -> StepRateLimit:
        """The limit as the definition of a step of type ``step_type`` holds it."""
        name = self.name if self.name is not None else step_type
        return StepRateLimit(name, self.limit, duration_ms(self.per, "rate_limit.per"))


__all__ = ["Concurrency", "RateLimit", "Retry"]


@dataclass(frozen=True)
class Compensate:
    """What undoes a step when its run fails or is cancelled after it succeeded (a saga:
    docs/usage.md#compensation-sagas): a step type, or a function (added to the workflow's
    registry under its name), with its own deadline, retry policy, queue and heartbeat
    timeout. ``compensate="refund"`` is ``Compensate("refund")``."""

    step: str | Callable[..., object]
    timeout: Duration = "30s"
    retry: Retry | None = None
    queue: str = DEFAULT_QUEUE
    heartbeat_timeout: Duration | None = None
    # The version of its function every run runs (absent: version 1; core/sagas.py).
    version: int | None = None

    def type_name(self) -> str:
        """Its step type: ``step``, or a function's name."""
        return self.step if isinstance(self.step, str) else str(getattr(self.step, "__name__", ""))

    def definition(self, name: str, reads: str, where: str) -> StepDef:
        """The task as the definition holds it: node ``name``, reading ``reads``."""
        return StepDef(
            name=name,
            step_type=self.type_name(),
            depends_on=(reads,),
            retry=RetryPolicy() if self.retry is None else self.retry.policy(),
            timeout_ms=duration_ms(self.timeout, f"{where}: timeout"),
            queue=self.queue,
            heartbeat_timeout_ms=optional_ms(self.heartbeat_timeout, f"{where}: heartbeat"),
            version=self.version,
        )
