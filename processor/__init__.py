"""Ductor: durable workflow runs, advanced by coordinator processors from Kafka wakeups and
committed to Postgres with optimistic concurrency; step workers run your step functions.

What your code imports, from here:

    from processor import StepContext, StepRegistry, client, load_settings

    registry = StepRegistry()  # `ductor worker --app my_package.steps:registry`


    @registry.step("charge_card")
    def charge_card(ctx: StepContext) -> dict[str, str]:
        return {"charged": ctx.run_id}


    result = client.wait_for_run(load_settings(), "order-17", timeout_s=30)

A steps module: ``StepRegistry``, ``StepContext``, ``StepFailed`` (fails the attempt; the
retry policy decides what follows) and ``NonRetryable`` (fails the step at once); or a
workflow written in code with its steps, ``Workflow`` and ``Retry`` (processor/authoring.py).
A program driving runs: ``client`` (start, wait for, list, signal and retry runs), with the typed
``Settings`` that ``load_settings()`` reads from the ``DUCTOR_*`` variables (``ConfigError``
when one is wrong), ``RunStatus`` and ``SignalKind``. A worker run from your own program
(``ductor worker`` is one): ``Worker`` with its ``WorkerOptions``. Everything else is internal
and may change between versions (its layers: docs/architecture.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The build this process runs (compiled modules or sources), chosen before any module of the
# package is imported; its three questions are the package's too.
from processor.build import choose_build
from processor.build import compiled_modules as compiled_modules
from processor.build import pure_python_selected as pure_python_selected
from processor.build import sources_first as sources_first

choose_build()

__all__ = [
    "Compensate",
    "Concurrency",
    "ConfigError",
    "NonRetryable",
    "RateLimit",
    "Retry",
    "RunStatus",
    "Settings",
    "SignalKind",
    "StepContext",
    "StepFailed",
    "StepRegistry",
    "Worker",
    "WorkerOptions",
    "Workflow",
    "client",
    "load_settings",
]

# Where each name is defined. They are imported on first use, not here: `python -m processor`
# must run processor/cli/early_stop.py before the modules load (a SIGTERM meanwhile is a clean
# stop), and a worker's child processes import this package again.
_HOMES = {
    "Compensate": "processor.authoring",
    "Concurrency": "processor.authoring",
    "ConfigError": "processor.io.config.values",
    "NonRetryable": "processor.worker.steps",
    "RateLimit": "processor.authoring",
    "Retry": "processor.authoring",
    "RunStatus": "processor.core.run_state",
    "Settings": "processor.io.config.settings",
    "SignalKind": "processor.core.model",
    "StepContext": "processor.worker.steps",
    "StepFailed": "processor.worker.steps",
    "StepRegistry": "processor.worker.steps",
    "Worker": "processor.worker.worker",
    "WorkerOptions": "processor.worker.options",
    "Workflow": "processor.authoring",
    "client": "processor.client",
    "load_settings": "processor.io.config.settings",
}

if TYPE_CHECKING:
    from processor import client as client
    from processor.authoring import Compensate as Compensate
    from processor.authoring import Concurrency as Concurrency
    from processor.authoring import RateLimit as RateLimit
    from processor.authoring import Retry as Retry
    from processor.authoring import Workflow as Workflow
    from processor.core.model import SignalKind as SignalKind
    from processor.core.run_state import RunStatus as RunStatus
    from processor.io.config.settings import Settings as Settings
    from processor.io.config.settings import load_settings as load_settings
    from processor.io.config.values import ConfigError as ConfigError
    from processor.worker.options import WorkerOptions as WorkerOptions
    from processor.worker.steps import NonRetryable as NonRetryable
    from processor.worker.steps import StepContext as StepContext
    from processor.worker.steps import StepFailed as StepFailed
    from processor.worker.steps import StepRegistry as StepRegistry
    from processor.worker.worker import Worker as Worker
else:

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'processor' has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home == f"{__name__}.{name}" else getattr(module, name)
        globals()[name] = value  # found at once from now on
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
