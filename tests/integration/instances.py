"""A processor or a step worker run in a thread of the test process, so its state can be
read live (the ``processor_thread`` fixture of fix_instances.py stops what it started)."""

from __future__ import annotations

import threading
import time

from processor.core.stats import Stats
from processor.engine.processor import Processor
from processor.io.config.settings import Settings
from processor.io.runtime.faults import NO_FAULTS, Faults
from processor.io.telemetry.setup import Telemetry
from processor.worker import StepRegistry, sample_registry
from processor.worker.options import WorkerOptions
from processor.worker.worker import Worker


class ProcessorThread:
    """A processor instance in a thread of the test process, so its stats can be read live."""

    def __init__(
        self, settings: Settings, telemetry: Telemetry | None = None, faults: Faults = NO_FAULTS
    ) -> None:
        self.stats = Stats()
        self.processor = Processor(
            settings, self.stats, telemetry=telemetry or Telemetry(), faults=faults
        )
        self._thread = threading.Thread(target=self.processor.run, name="processor", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The instance's loop is still running (it stops only when told to, or on a crash)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self.processor.stop()
        self._thread.join(60)
        assert not self._thread.is_alive(), "processor did not stop within 60 s"


class WorkerThread:
    """A step worker in a thread of the test process, so its state can be read live."""

    def __init__(
        self,
        settings: Settings,
        registry: StepRegistry | None = None,
        threads: int = 4,
        options: WorkerOptions | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.worker = Worker(
            settings,
            registry or sample_registry(),
            options or WorkerOptions(concurrency=threads),
            telemetry=telemetry or Telemetry(),
        )
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # what would have ended a `ductor worker` process
            self.error = exc
            raise

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> float:
        """Stop the worker; returns how long it took."""
        started = time.monotonic()
        self.worker.stop()
        self._thread.join(timeout)
        return time.monotonic() - started
