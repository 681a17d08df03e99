"""Plumbing of the benchmark: pacing, child processes, the figures (printed by
bench_report.py), and a stand-in OTLP collector."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from processor.io.telemetry.logs import read_stats
from processor.tools.bench_cpu import CpuUse
from processor.tools.bench_rounds import Round
from processor.tools.latency_figures import IdleLatency

# The process groups of the CPU figures, in the order of the report's columns.
GROUPS = ("instance", "worker", "broker", "postgres")


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


@dataclass(frozen=True)
class Cost:
    """One measured window: the ticks committed in it, its length, and the CPU each group
    of processes spent in it."""

    ticks: int
    seconds: float
    cpu: CpuUse

    @property
    def rate(self) -> float:
        return self.ticks / self.seconds if self.seconds > 0 else 0.0

    def per_unit_us(self, group: str, units: int) -> float | None:
        """CPU µs of ``group`` per unit (tick, run); None when its processes are unknown."""
        seconds = self.cpu.seconds.get(group)
        return None if seconds is None or units <= 0 else seconds / units * 1e6

    def total_us(self, units: int) -> float:
        known = [v for g in GROUPS if (v := self.per_unit_us(g, units)) is not None]
        return sum(known)

    def machine_us(self, units: int) -> float:
        return self.cpu.machine / units * 1e6 if units > 0 else 0.0

    def cores(self, group: str) -> float | None:
        """How many cores ``group`` kept busy on average over the window."""
        seconds = self.cpu.seconds.get(group)
        return None if seconds is None or self.cpu.wall <= 0 else seconds / self.cpu.wall


PURE_PYTHON_ENV = "DUCTOR_PURE_PYTHON"
# The builds' labels in the comparison's rounds.
COMPILED, PURE = "compiled", "pure"
# Run in a child with the benchmark's environment and a build's: the package's modules that
# the services' imports load from compiled code.
_LIST_COMPILED = (
    "import processor, processor.engine.processor, processor.worker.worker;"
    "print(','.join(processor.compiled_modules()))"
)


def compiled_modules_of_children(build_env: dict[str, str]) -> list[str]:
    """The compiled modules a `ductor` process spawned with ``build_env`` would run."""
    env = {**os.environ, **build_env}
    done = subprocess.run(
        [sys.executable, "-c", _LIST_COMPILED],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [name for name in done.stdout.strip().split(",") if name]


@dataclass
class BuildFigures:
    """The phases run again on the pure-Python modules, the end-to-end rounds of both builds
    by processes per kind (1 + 1, 2 + 2), and what the compiled build compiles (empty:
    nothing, and no comparison was made)."""

    compiled: list[str] = field(default_factory=list)
    instance: Cost | None = None
    latency: dict[str, Any] | None = None
    e2e: dict[int, list[Round]] = field(default_factory=dict)


@dataclass
class Figures:
    ceiling: float = 0.0
    instance: float = 0.0
    traced: float = 0.0
    sampled: float = 0.0
    naive: float = 0.0
    rss: int = 0
    latency: dict[str, Any] | None = None
    idle_latency: IdleLatency | None = None  # one run at a time (bench_latency.py)
    loaded_latency: IdleLatency | None = None  # the same beside a tenth of the peak
    floor: list[str] = field(default_factory=list)  # one hop's floor (bench_floor.py), printed
    hot_on: dict[str, Any] | None = None
    hot_off: dict[str, Any] | None = None
    costs: dict[str, Cost] = field(default_factory=dict)  # by phase, in the order measured
    e2e: list[dict[str, Any]] = field(default_factory=list)
    scaling: list[dict[str, Any]] = field(default_factory=list)
    partitions: int = 0  # per wakeup topic in the scaling phases
    # The same two phases on a local three-broker cluster (`make bench` with --cluster).
    cluster_e2e: list[dict[str, Any]] = field(default_factory=list)
    cluster_scaling: list[dict[str, Any]] = field(default_factory=list)
    idle: CpuUse | None = None  # the services with nothing of ours running
    builds: BuildFigures = field(default_factory=BuildFigures)
    wall: float = 0.0  # the whole benchmark, seconds


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
