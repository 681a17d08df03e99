"""Plumbing of the benchmark: pacing, child processes, the figures and their
report, and a stand-in OTLP collector."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from processor.io.logs import read_stats


def paced(
    seconds: float, count: int, send: Callable[[int], None], extra: Callable[[], None]
) -> None:
    """Send ``count`` items evenly over ``seconds`` (and one `extra` per item, the hot load)."""
    started = time.monotonic()
    for i in range(count):
        target = started + seconds * i / count
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        send(i)
        extra()


def stop(child: subprocess.Popen[bytes]) -> None:
    child.terminate()
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(10)


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def final_stats(path: Path) -> dict[str, Any]:
    stats = read_stats(path, final=True)
    if stats is None:
        raise RuntimeError(f"no final stats in {path}")
    return stats


@dataclass
class Figures:
    ceiling: float = 0.0
    instance: float = 0.0
    traced: float = 0.0
    sampled: float = 0.0
    naive: float = 0.0
    rss: int = 0
    latency: dict[str, Any] | None = None
    hot_on: dict[str, Any] | None = None
    hot_off: dict[str, Any] | None = None


def report(f: Figures) -> None:
    rows = [
        ("DB-only ceiling (batched UPDATE, best of 3)", f"{f.ceiling:10.0f} ticks/s"),
        ("one `ductor process`, uncontended runs", f"{f.instance:10.0f} ticks/s"),
        ("naive one-record-at-a-time loop (baseline)", f"{f.naive:10.0f} ticks/s"),
        ("instance / naive", f"{f.instance / f.naive:10.1f} x   (target >= 10)"),
        ("instance / ceiling", f"{f.instance / f.ceiling:10.2f}     (target >= 0.6)"),
        ("peak RSS of the instance", f"{f.rss / 2**20:10.0f} MiB (target <= 250)"),
        ("same instance, tracing + metrics on, all sampled", f"{f.traced:10.0f} ticks/s"),
        ("telemetry on / off", f"{f.traced / f.instance:10.2f}     (target >= 0.8)"),
        ("same, traces sampled at 10 % (metrics all)", f"{f.sampled:10.0f} ticks/s"),
        ("telemetry at 10 % sampling / off", f"{f.sampled / f.instance:10.2f}"),
    ]
    print()
    print("Ductor benchmark (one run, real Kafka and Postgres on this machine)")
    for label, value in rows:
        print(f"  {label:46} {value}")
    if f.latency is not None:
        lat = f.latency
        print(
            f"  wakeup-to-commit at {lat['rate']:.0f} ticks/s (half peak), one instance:"
            f" p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms (target p99 <= 50)"
        )
    for name, hot in (("co-partitioned by run", f.hot_on), ("spread over partitions", f.hot_off)):
        if hot is None:
            continue
        print(
            f"  hot mix, {name} ({hot['runs']} runs + 10 hot, 2 instances + 2 workers,"
            f" ~{hot['rate']:.0f} ticks/s):"
        )
        print(
            f"    wasted attempts {hot['wasted'] * 100:5.1f} %  ({hot['conflicts']} conflicts"
            f" / {hot['attempts']} commit attempts; target <= 10 %), errors {hot['errors']}"
        )
        latency = f"p50 {hot['p50']:.1f} ms, p99 {hot['p99']:.1f} ms"
        print(f"    wakeup-to-commit {latency} (target p99 <= 50)")


class OtlpSink:
    """A stand-in OTLP/HTTP collector that accepts and drops everything, so tracing costs what
    it costs in production (spans built, batched, serialised, sent) without a collector."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def env(self) -> dict[str, str]:
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.server.server_port}",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        }

    def close(self) -> None:
        self.server.shutdown()
