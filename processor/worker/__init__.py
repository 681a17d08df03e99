"""Step workers: the program that runs the users' step functions (``ductor worker``).

What a steps module imports (from the package root, ``from processor import ...``):
``StepRegistry``, ``StepContext``, ``StepFailed`` and ``NonRetryable``. The worker itself is
``processor.worker.worker.Worker`` (``processor.Worker``: its loop, timed in ``turns``, and the
parts built from its settings alone in ``worker_parts``), composed by ``assembly`` around one
book and one injected clock: the flow's state moves (``flow``) beside the tasks taken in
(``intake``), claims (``claiming``), runs (``runs``), the deadline and heartbeat watch
(``watch``) and results (``results``); the tasks it holds (``tasks``, ``permits``,
``handback``), where they come from (``source``, ``backlog``, ``static_join``), its two
database lanes (``database``, ``lanes``, ``lane_batches``, ``messages``), what runs the
steps (``runners``, ``isolation``, ``environment``), ``--app`` loading (``app``,
``options``), the sample steps (``samples``), its probe (``health``), metrics and counters
(``metrics``, ``stats``).
"""

from processor.worker.samples import sample_registry
from processor.worker.steps import (
    MAX_STEP_OUTPUT_BYTES,
    NonRetryable,
    RegistrationError,
    StepContext,
    StepFailed,
    StepRegistry,
)

__all__ = [
    "MAX_STEP_OUTPUT_BYTES",
    "NonRetryable",
    "RegistrationError",
    "StepContext",
    "StepFailed",
    "StepRegistry",
    "sample_registry",
]
