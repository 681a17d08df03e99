"""The cyclic garbage collector, set for a service's long-running loop."""

from __future__ import annotations

import gc

# Allocations between two collections of the youngest generation (CPython's default is 700).
# A task or a tick allocates a few hundred objects, nearly all freed by reference counting;
# collecting every 10,000 took ~15 % off the worker's CPU per run and ~7 % off the processor's
# (docs/performance.md, "The garbage collector settled"). The older generations
# keep their defaults (each collected after ten collections of the one below).
YOUNG_THRESHOLD = 10_000


def settle_collector() -> None:
    """Call once a service has started: what is alive then (modules, clients, settings, the
    steps' functions) lives as long as the process, so the collector's full passes no longer
    rescan it (``gc.freeze``), and the youngest generation is collected less often. Cycles
    are still collected, a little later."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 10, 10)
