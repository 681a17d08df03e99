"""A steps module of the tests' own (`ductor worker --app
tests.integration.environ_steps:registry`): its one step reports what step code finds of the
engine's keys in its environment, so a test sees it as a user's step would.

``read_environ`` takes ``markers`` (secret values: passwords, a token, a secret file's path)
and returns the names of the variables that look like credentials (``DUCTOR_*`` holding a DSN,
a password, a token, a file), those whose value holds a marker, and whether the process's
starting environment (``/proc/self/environ``) holds one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from processor.worker import StepContext, StepRegistry

registry = StepRegistry()
_LOOKS_SECRET = ("DSN", "PASSWORD", "TOKEN", "SECRET", "_FILE", "SASL")


@registry.step("read_environ")
def read_environ(ctx: StepContext) -> dict[str, Any]:
    markers: list[str] = ctx.input["markers"]
    environ = dict(os.environ)
    started = Path("/proc/self/environ")
    initial = started.read_bytes().decode(errors="replace") if started.exists() else ""
    return {
        "pid": os.getpid(),
        "has_path": "PATH" in environ,  # it read a real environment
        "secret_names": sorted(
            k for k in environ if k.startswith("DUCTOR_") and any(s in k for s in _LOOKS_SECRET)
        ),
        "leaks": sorted(k for k, v in environ.items() if any(m in v for m in markers)),
        "initial_leaks": sorted(m for m in markers if m in initial),
    }
