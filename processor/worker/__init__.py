"""Step workers: the program that runs the users' step functions (``ductor worker``).

What a steps module imports (from the package root, ``from processor import ...``):
``StepRegistry``, ``StepContext``, ``StepFailed`` and ``NonRetryable``. The worker itself is
``processor.worker.worker.Worker`` (``processor.Worker``).
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
