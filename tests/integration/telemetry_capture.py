"""Reading the metrics a test's in-process instance exported to an in-memory reader."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics.export import InMemoryMetricReader


def metric_values(
    reader: InMemoryMetricReader, name: str
) -> dict[tuple[tuple[str, Any], ...], float]:
    """Current value of a counter or gauge by attribute set (empty when never observed)."""
    data = reader.get_metrics_data()
    values: dict[tuple[tuple[str, Any], ...], float] = {}
    if data is None:
        return values
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        values[tuple(sorted((point.attributes or {}).items()))] = point.value  # type: ignore[union-attr]
    return values
