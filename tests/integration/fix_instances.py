"""Plugin: processor instances run in threads of the test process (``processor_thread``),
stopped at the test's end."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from processor.io.config.settings import Settings
from processor.io.runtime.faults import NO_FAULTS, Faults
from processor.io.telemetry.setup import Telemetry

from .instances import ProcessorThread


@pytest.fixture
def processor_thread() -> Iterator[Callable[..., ProcessorThread]]:
    started: list[ProcessorThread] = []

    def start(
        settings: Settings, telemetry: Telemetry | None = None, faults: Faults = NO_FAULTS
    ) -> ProcessorThread:
        instance = ProcessorThread(settings, telemetry, faults)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.stop()
