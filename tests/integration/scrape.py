"""Reading a process's Prometheus endpoint in the tests: a free port to give it, its
exposition, and one sample's values by their labels."""

from __future__ import annotations

import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> str:
    """The exposition, or "" while nothing answers yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())
    except OSError:
        return ""


def values(exposition: str, sample: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The values of one sample name by their labels (the exporter's scope labels left out)."""
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(exposition):
        for point in family.samples:
            if point.name == sample:
                labels = {k: v for k, v in point.labels.items() if not k.startswith("otel_")}
                found[tuple(sorted(labels.items()))] = point.value
    return found
