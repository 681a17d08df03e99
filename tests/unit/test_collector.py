"""The collector as the services set it once started (io/runtime/collector.py), in a process of its
own: the settings take, and a reference cycle made afterwards is still collected on its own,
by allocation, without a gc.collect()."""

from __future__ import annotations

import subprocess
import sys

_CHILD = """
import gc, weakref
from processor.io.runtime.collector import YOUNG_THRESHOLD, settle_collector

settle_collector()
assert gc.get_threshold()[0] == YOUNG_THRESHOLD, gc.get_threshold()
assert gc.get_freeze_count() > 0

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: reference counting alone never frees it
gone = weakref.ref(a)
del a, b
kept = [[] for _ in range(YOUNG_THRESHOLD // 2)]  # fewer allocations than the threshold
assert gone() is not None, "collected before the threshold"
kept += [[] for _ in range(YOUNG_THRESHOLD * 3)]  # past it
assert gone() is None, "a cycle made after settle_collector() was never collected"
print("ok")
"""


def test_the_settled_collector_still_collects_cycles_by_allocation() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
