"""The one table of metrics (io/telemetry/metrics.py): each service creates exactly its
metrics from it, and the docs that list metrics say what the table says."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from processor.core.stats import Stats
from processor.io.telemetry.metrics import (
    METRICS,
    PROCESSOR,
    WORKER,
    MetricKind,
    Service,
    metrics_of,
)
from processor.io.telemetry.setup import Telemetry
from processor.worker.metrics import WorkerMetrics
from processor.worker.stats import WorkerStats

DOCS = Path(__file__).resolve().parents[2] / "docs"
Created = tuple[str, str, str, str, str]  # scope, kind, name, unit, description


class _Histogram:
    def record(self, *_args: Any, **_kwargs: Any) -> None:
        pass


class _Meter:
    """A plain fake of an OpenTelemetry meter: it notes each instrument created."""

    def __init__(self, scope: str, created: list[Created]) -> None:
        self._scope = scope
        self._created = created

    def _note(self, kind: str, name: str, unit: str, description: str) -> None:
        self._created.append((self._scope, kind, name, unit, description))

    def create_observable_counter(
        self, name: str, callbacks: list[Callable[..., Any]], unit: str, description: str
    ) -> None:
        assert all(callable(c) for c in callbacks)
        self._note("counter", name, unit, description)

    def create_observable_gauge(
        self, name: str, callbacks: list[Callable[..., Any]], unit: str, description: str
    ) -> None:
        self._note("gauge", name, unit, description)

    def create_histogram(self, name: str, unit: str, description: str) -> _Histogram:
        self._note("histogram", name, unit, description)
        return _Histogram()


class _Provider:
    def __init__(self) -> None:
        self.created: list[Created] = []

    def get_meter(self, scope: str) -> _Meter:
        return _Meter(scope, self.created)


def _table(service: Service) -> list[Created]:
    return sorted(
        (service.value, m.kind.value, m.name, m.unit, m.description)
        for m in metrics_of(service).values()
    )


def test_the_processor_creates_every_metric_of_its_table_and_no_other() -> None:
    provider = _Provider()
    telemetry = Telemetry(meter_provider=provider)  # type: ignore[arg-type]
    telemetry.instrument(Stats(), lambda: {})
    telemetry.instrument_readiness(lambda: True, lambda: 0)
    assert sorted(provider.created) == _table(PROCESSOR)


def test_the_worker_creates_every_metric_of_its_table_and_no_other() -> None:
    provider = _Provider()
    telemetry = Telemetry(meter_provider=provider)  # type: ignore[arg-type]
    WorkerMetrics(telemetry, WorkerStats(), lambda: (0, 0), lambda: 0, lambda: True, lambda: 0)
    assert sorted(provider.created) == _table(WORKER)


def test_one_row_per_metric_of_a_service() -> None:
    keys = [(m.service, m.name) for m in METRICS]
    assert len(keys) == len(set(keys))


def test_the_telemetry_page_lists_the_processors_metrics() -> None:
    """docs/telemetry.md#metrics: one row per metric, its type as the table says."""
    page = (DOCS / "telemetry.md").read_text()
    section = page.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(ductor\.[a-z_.]+)` \| ([a-z]+(?: \(ms\))?) \|", section, re.M)
    expected = {
        m.name: m.kind.value + (" (ms)" if m.kind is MetricKind.HISTOGRAM else "")
        for m in metrics_of(PROCESSOR).values()
    }
    assert dict(rows) == expected
    assert len(rows) == len(expected)


def test_the_workers_page_lists_the_workers_metrics() -> None:
    """docs/operations/workers.md names every metric of a worker, by its Prometheus name."""
    page = (DOCS / "operations" / "workers.md").read_text()
    named = set(re.findall(r"`(ductor_[a-z_]+)", page))
    missing = [m.prometheus_name for m in metrics_of(WORKER).values()]
    assert [name for name in missing if name not in named] == []


def test_every_metric_the_docs_name_is_in_the_table() -> None:
    """A Prometheus name in the docs (a counter's ``_total``, a histogram's ``_milliseconds``)
    is one a service exports."""
    exported = {m.prometheus_name for m in METRICS}
    pages = [*DOCS.glob("*.md"), *DOCS.glob("operations/*.md"), DOCS.parent / "README.md"]
    wrong = []
    for page in pages:
        for name in re.findall(r"\b(ductor_[a-z_]+?_(?:total|milliseconds))\b", page.read_text()):
            if name not in exported:
                wrong.append(f"{page.name}: {name}")
    assert wrong == []
